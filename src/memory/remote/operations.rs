//! What the one list of memory operations (`super`'s `memory_operations!`
//! invocation) becomes, so that an operation is written once: the
//! [`MemoryApi`](super::MemoryApi) trait itself; each call as a value
//! ([`MemoryCall`](super::MemoryCall)) and each answer as one
//! ([`MemoryAnswer`](super::MemoryAnswer)); and [`Layered`](super::Layered),
//! the implementation that passes every call through a
//! [`MemoryLayer`](super::MemoryLayer) on its way to another api. A wrapper
//! (a test's counter, a fault) is then a layer: it says what it does around
//! a call, and every operation it does not single out goes through as it is.
//! Adding an operation means adding it to the list, and to the
//! implementations that really serve it (the HTTP client, a test's fake).
//!
//! Each operation is written as the trait method it is, behind the name of
//! its call's variant: `Variant => fn name<'a>(&'a self, args…) ->
//! BoxFuture<'a, Result<Answer, Error>>`, then `;` or the default body.
//! After the operations comes `single_attempt`, the one method that is not an
//! endpoint: through a layer it is the inner api's twin behind the same layer.
//! The names the list uses (`BoxFuture`, `Error`, `Arc`) and `Layered`,
//! `MemoryLayer` are those in scope where the list is.

/// The memory API from its list of operations; see the module's doc.
macro_rules! memory_operations {
    (
        $(#[$trait_attr:meta])*
        pub trait MemoryApi: Send + Sync {
            operations {
                $(
                    $(#[$attr:meta])*
                    $Variant:ident => fn $name:ident<'a>(&'a $self:ident $(, $arg:ident: $ty:ty)* $(,)?)
                        -> BoxFuture<'a, Result<$answer:ty, Error>> $body:tt
                )*
            }
            $(#[$single_attr:meta])*
            fn single_attempt(&$single_self:ident) -> Option<Arc<dyn MemoryApi>> $single_body:block
        }
    ) => {
        $(#[$trait_attr])*
        pub trait MemoryApi: Send + Sync {
            $(
                $(#[$attr])*
                fn $name<'a>(&'a $self $(, $arg: $ty)*)
                    -> BoxFuture<'a, Result<$answer, Error>> $body
            )*

            $(#[$single_attr])*
            fn single_attempt(&$single_self) -> Option<Arc<dyn MemoryApi>> $single_body
        }

        /// One call of a [`MemoryApi`] operation, with its arguments: what a
        /// [`MemoryLayer`] sees go by.
        pub enum MemoryCall<'a> {
            $(
                #[doc = concat!("A call of [`MemoryApi::", stringify!($name), "`].")]
                $Variant { $($arg: $ty),* },
            )*
        }

        /// The answer of a [`MemoryCall`], by operation.
        pub enum MemoryAnswer {
            $(
                #[doc = concat!("The answer of [`MemoryApi::", stringify!($name), "`].")]
                $Variant($answer),
            )*
        }

        impl<'a> MemoryCall<'a> {
            /// The call made on `api`.
            pub fn send(
                self,
                api: &'a dyn MemoryApi,
            ) -> BoxFuture<'a, Result<MemoryAnswer, Error>> {
                match self {
                    $(
                        MemoryCall::$Variant { $($arg),* } => {
                            let answer = api.$name($($arg),*);
                            Box::pin(async move { answer.await.map(MemoryAnswer::$Variant) })
                        }
                    )*
                }
            }
        }

        /// Each call through the layer, to the inner api; the single-attempt
        /// twin is the inner api's twin behind the same layer (its state
        /// shared), or none when the inner api has none.
        impl<L: MemoryLayer> MemoryApi for Layered<L> {
            $(
                fn $name<'a>(&'a self $(, $arg: $ty)*)
                    -> BoxFuture<'a, Result<$answer, Error>>
                {
                    let answer = self.layer.around(MemoryCall::$Variant { $($arg),* }, &*self.inner);
                    Box::pin(async move {
                        match answer.await? {
                            MemoryAnswer::$Variant(answer) => Ok(answer),
                            #[allow(unreachable_patterns)]
                            _ => panic!(concat!(
                                "a memory layer answered `",
                                stringify!($name),
                                "` with another operation's answer"
                            )),
                        }
                    })
                }
            )*

            fn single_attempt(&self) -> Option<Arc<dyn MemoryApi>> {
                let inner = self.inner.single_attempt()?;
                Some(Arc::new(Layered {
                    layer: self.layer.clone(),
                    inner,
                }))
            }
        }
    };
}

pub(super) use memory_operations;
