//! PostgreSQL's SQL text shared by its statement files: the clock expressions and quoted
//! names.

// Clocks. `now()` is the start of the statement's transaction: taken before the statement
// waits for a row lock, so a lease it writes ends no later than the holder reckons, and an
// expiry it checks is judged no earlier than it happened.
pub(super) const PG_US: &str = "(EXTRACT(EPOCH FROM now()) * 1000000)::bigint";
pub(super) const PG_MS_FLOOR: &str = "floor(EXTRACT(EPOCH FROM now()) * 1000)::bigint";
pub(super) const PG_MS_CEIL: &str = "ceil(EXTRACT(EPOCH FROM now()) * 1000)::bigint";
pub(super) const PG_UTC: &str = "(now() AT TIME ZONE 'UTC')";

/// PostgreSQL folds unquoted names to lower case; quoting the folded name gives the same table
/// as an unquoted reference (Spring's `INT_LOCK` is `int_lock`) and survives reserved words.
pub(super) fn pg_ident(name: &str) -> String {
    format!("\"{}\"", name.to_ascii_lowercase())
}

pub(super) fn pg_table(schema: Option<&str>, table: &str) -> String {
    match schema {
        Some(s) => format!("{}.{}", pg_ident(s), pg_ident(table)),
        None => pg_ident(table),
    }
}
