//! Prints the configuration reference (`docs/src/configuration/reference.md`):
//! `cargo run --example config-reference > docs/src/configuration/reference.md`.

fn main() {
    print!("{}", envworker::cli::reference::render());
}
