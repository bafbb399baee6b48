//! A wrapper around a memory api as a layer: it states what it does around
//! a call (count it, hold it back, alter its answer) and passes the call on;
//! the forwarding of every operation is generated from the one list (see
//! `super::operations`).

use std::sync::Arc;

use futures::future::BoxFuture;

use super::{MemoryAnswer, MemoryApi, MemoryCall};
use crate::api::Error;

/// What a wrapper does around each call it passes on to the api inside.
pub trait MemoryLayer: Send + Sync + 'static {
    /// Serve `call`, by way of `inner` as a rule. The default passes it on
    /// as it is; a layer matches the calls it cares about and sends the
    /// rest with [`MemoryCall::send`]. Whatever happens before the returned
    /// future is polled happens when the call is made.
    fn around<'a>(
        &'a self,
        call: MemoryCall<'a>,
        inner: &'a dyn MemoryApi,
    ) -> BoxFuture<'a, Result<MemoryAnswer, Error>> {
        call.send(inner)
    }
}

/// A memory api seen through a layer: a [`MemoryApi`] itself, each call
/// going through [`MemoryLayer::around`] to `inner`. The layer is shared,
/// so its state (counts, hooks) is the same for the api's single-attempt
/// twin.
pub struct Layered<L> {
    pub(super) layer: Arc<L>,
    pub(super) inner: Arc<dyn MemoryApi>,
}

impl<L: MemoryLayer> Layered<L> {
    pub fn new(layer: Arc<L>, inner: Arc<dyn MemoryApi>) -> Self {
        Layered { layer, inner }
    }
}
