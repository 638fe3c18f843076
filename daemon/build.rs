//! Rebuilds the crate when a migration is added or changed: `sqlx::migrate!` embeds
//! `migrations/` at compile time, and Cargo does not watch that directory by itself
//! (the build script sqlx's documentation recommends).
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
