//! PostgreSQL statements: prepared once per connection, with `$n` parameters.

/// The SQL text of one backend instance.
#[derive(Debug, Clone)]
pub(crate) struct Pg {
    /// Creation of the table (and schema), run under an advisory transaction lock.
    pub(crate) create: Vec<String>,
    /// `SELECT to_regclass(...) IS NOT NULL`.
    pub(crate) exists: String,
    /// The common case first: an `UPDATE` of the key's existing row (same parameters and
    /// result as `acquire`); no row means the key has no row yet, or it is busy and already
    /// marked wanted, and `acquire` decides. `None` in Spring mode, where rows are deleted on
    /// release.
    pub(crate) acquire_existing: Option<String>,
    pub(crate) acquire: String,
    pub(crate) release: String,
    pub(crate) extend: String,
    pub(crate) extend_many: String,
    pub(crate) inspect: String,
    pub(crate) force_delete: String,
}

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

impl Pg {
    /// Native layout. Parameters: see each statement.
    pub(crate) fn native(schema: Option<&str>, table: &str) -> Self {
        let t = pg_table(schema, table);
        let free = format!(
            "(l.token IS NULL OR l.token = excluded.token OR l.expires_ms <= {PG_MS_FLOOR})"
        );
        let mut create = Vec::new();
        if let Some(s) = schema {
            create.push(format!("CREATE SCHEMA IF NOT EXISTS {}", pg_ident(s)));
        }
        create.push(format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                region TEXT NOT NULL,
                lock_key TEXT NOT NULL,
                token TEXT NULL,
                fence BIGINT NOT NULL,
                created_ms BIGINT NOT NULL,
                expires_ms BIGINT NOT NULL,
                wanted_ms BIGINT NULL,
                PRIMARY KEY (region, lock_key)
            )"
        ));
        let free_old =
            format!("(l.token IS NULL OR l.token = $3 OR l.expires_ms <= {PG_MS_FLOOR})");
        Pg {
            create,
            exists: exists_query(schema, table),
            // $1 region, $2 key, $3 token, $4 lease ms, $5 want window ms. A plain UPDATE costs
            // about a third less than the upsert below when the row exists, which it does after
            // the key's first use. It always writes the row (also when busy), so that "no row"
            // can only mean a missing row... or a busy row whose stamp is fresh, see WHERE.
            acquire_existing: Some(format!(
                "UPDATE {t} AS l SET
                     token = CASE WHEN {free_old} THEN $3 ELSE l.token END,
                     fence = CASE WHEN {free_old} THEN GREATEST(l.fence + 1, {PG_US}) ELSE l.fence END,
                     created_ms = CASE WHEN {free_old} THEN {PG_MS_CEIL} ELSE l.created_ms END,
                     expires_ms = CASE WHEN {free_old} THEN {PG_MS_CEIL} + $4::bigint
                                       ELSE l.expires_ms END,
                     wanted_ms = CASE WHEN {free_old} THEN l.wanted_ms
                                      ELSE {PG_MS_CEIL} + $5::bigint END
                 WHERE region = $1 AND lock_key = $2
                   AND ({free_old} OR l.wanted_ms IS NULL
                        OR l.wanted_ms < {PG_MS_CEIL} + $5::bigint / 2)
                 RETURNING token = $3, fence, expires_ms - {PG_MS_CEIL}"
            )),
            // $1 region, $2 key, $3 token, $4 lease ms, $5 want window ms.
            // Takes a free, expired or own row; on a busy row only (re)stamps `wanted_ms` when
            // less than half of the window is left, else writes nothing and returns no row.
            // Returns (ours, fence, remaining ms of the holder).
            acquire: format!(
                "INSERT INTO {t} AS l (region, lock_key, token, fence, created_ms, expires_ms, wanted_ms)
                 VALUES ($1, $2, $3, {PG_US}, {PG_MS_CEIL}, {PG_MS_CEIL} + $4::bigint, NULL)
                 ON CONFLICT (region, lock_key) DO UPDATE SET
                     token = CASE WHEN {free} THEN excluded.token ELSE l.token END,
                     fence = CASE WHEN {free} THEN GREATEST(l.fence + 1, excluded.fence) ELSE l.fence END,
                     created_ms = CASE WHEN {free} THEN excluded.created_ms ELSE l.created_ms END,
                     expires_ms = CASE WHEN {free} THEN excluded.expires_ms ELSE l.expires_ms END,
                     wanted_ms = CASE WHEN {free} THEN l.wanted_ms
                                      ELSE excluded.created_ms + $5::bigint END
                 WHERE {free} OR l.wanted_ms IS NULL
                    OR l.wanted_ms < excluded.created_ms + $5::bigint / 2
                 RETURNING token = $3, fence, expires_ms - {PG_MS_CEIL}"
            ),
            // $1 region, $2 key, $3 token, $4 channel, $5 payload. Returns (contended) when
            // released; notifies listeners in the same statement when a waiter stamped the row.
            release: format!(
                "UPDATE {t} SET token = NULL
                 WHERE region = $1 AND lock_key = $2 AND token = $3 AND expires_ms > {PG_MS_FLOOR}
                 RETURNING COALESCE(wanted_ms > {PG_MS_FLOOR}, false),
                     CASE WHEN wanted_ms > {PG_MS_FLOOR} THEN pg_notify($4, $5)::text END"
            ),
            // $1 region, $2 key, $3 token, $4 lease ms.
            extend: format!(
                "UPDATE {t} SET expires_ms = {PG_MS_CEIL} + $4::bigint
                 WHERE region = $1 AND lock_key = $2 AND token = $3 AND expires_ms > {PG_MS_FLOOR}
                 RETURNING 1"
            ),
            // $1 regions, $2 keys, $3 tokens, $4 lease ms. Returns the extended entries.
            extend_many: format!(
                "UPDATE {t} AS l SET expires_ms = {PG_MS_CEIL} + b.lease_ms
                 FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[])
                      AS b(region, lock_key, token, lease_ms)
                 WHERE l.region = b.region AND l.lock_key = b.lock_key AND l.token = b.token
                   AND l.expires_ms > {PG_MS_FLOOR}
                 RETURNING l.region, l.lock_key, l.token"
            ),
            // $1 region, $2 key. Returns (fence, remaining ms) when held.
            inspect: format!(
                "SELECT fence, expires_ms - {PG_MS_CEIL} FROM {t}
                 WHERE region = $1 AND lock_key = $2 AND token IS NOT NULL
                   AND expires_ms > {PG_MS_FLOOR}"
            ),
            // $1 region, $2 key, $3 channel, $4 payload.
            force_delete: format!(
                "UPDATE {t} SET token = NULL
                 WHERE region = $1 AND lock_key = $2 AND token IS NOT NULL
                   AND expires_ms > {PG_MS_FLOOR}
                 RETURNING pg_notify($3, $4)::text"
            ),
        }
    }

    /// Spring's `INT_LOCK` layout; `$1` is always the `LOCK_KEY`, `$2` the `REGION`, `$3` the
    /// `CLIENT_ID`, in the same roles as in [`native`](Self::native) otherwise.
    pub(crate) fn spring(schema: Option<&str>, table: &str) -> Self {
        let t = pg_table(schema, table);
        let fence = "(EXTRACT(EPOCH FROM CREATED_DATE) * 1000000)::bigint";
        let remaining =
            format!("ceil(EXTRACT(EPOCH FROM (EXPIRED_AFTER - {PG_UTC})) * 1000)::bigint");
        let lease = "($4::bigint * INTERVAL '1 millisecond')";
        let mut create = Vec::new();
        if let Some(s) = schema {
            create.push(format!("CREATE SCHEMA IF NOT EXISTS {}", pg_ident(s)));
        }
        // Spring's schema-postgresql.sql, with IF NOT EXISTS.
        create.push(format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                LOCK_KEY CHAR(36) NOT NULL,
                REGION VARCHAR(100) NOT NULL,
                CLIENT_ID CHAR(36),
                CREATED_DATE TIMESTAMP NOT NULL,
                EXPIRED_AFTER TIMESTAMP NOT NULL,
                constraint {} primary key (LOCK_KEY, REGION)
            )",
            pg_ident(&format!("{table}_PK"))
        ));
        Pg {
            create,
            exists: exists_query(schema, table),
            acquire_existing: None,
            // $1 key, $2 region, $3 client id, $4 lease ms, $5 unused (want window).
            acquire: format!(
                "INSERT INTO {t} AS l (LOCK_KEY, REGION, CLIENT_ID, CREATED_DATE, EXPIRED_AFTER)
                 VALUES ($1, $2, $3, {PG_UTC}, {PG_UTC} + {lease})
                 ON CONFLICT (LOCK_KEY, REGION) DO UPDATE SET
                     CLIENT_ID = excluded.CLIENT_ID,
                     CREATED_DATE = excluded.CREATED_DATE,
                     EXPIRED_AFTER = excluded.EXPIRED_AFTER
                 WHERE l.CLIENT_ID = excluded.CLIENT_ID OR l.EXPIRED_AFTER < excluded.CREATED_DATE
                 RETURNING CLIENT_ID = $3 AND $5::bigint IS NOT NULL, {fence}, {remaining}"
            ),
            // $1 key, $2 region, $3 client id, $4 channel, $5 payload.
            release: format!(
                "DELETE FROM {t}
                 WHERE LOCK_KEY = $1 AND REGION = $2 AND CLIENT_ID = $3
                   AND EXPIRED_AFTER >= {PG_UTC}
                 RETURNING false, pg_notify($4, $5)::text"
            ),
            extend: format!(
                "UPDATE {t} SET EXPIRED_AFTER = {PG_UTC} + {lease}
                 WHERE LOCK_KEY = $1 AND REGION = $2 AND CLIENT_ID = $3
                   AND EXPIRED_AFTER >= {PG_UTC}
                 RETURNING 1"
            ),
            // $1 keys, $2 regions, $3 client ids, $4 lease ms.
            extend_many: format!(
                "UPDATE {t} AS l SET EXPIRED_AFTER = {PG_UTC} + b.lease_ms * INTERVAL '1 millisecond'
                 FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[])
                      AS b(lock_key, region, client_id, lease_ms)
                 WHERE l.LOCK_KEY = b.lock_key::char(36) AND l.REGION = b.region
                   AND l.CLIENT_ID = b.client_id::char(36) AND l.EXPIRED_AFTER >= {PG_UTC}
                 RETURNING l.LOCK_KEY::text, l.REGION::text, l.CLIENT_ID::text"
            ),
            inspect: format!(
                "SELECT {fence}, {remaining} FROM {t}
                 WHERE LOCK_KEY = $1 AND REGION = $2 AND EXPIRED_AFTER >= {PG_UTC}"
            ),
            // $1 key, $2 region, $3 channel, $4 payload.
            force_delete: format!(
                "DELETE FROM {t} WHERE LOCK_KEY = $1 AND REGION = $2
                 RETURNING pg_notify($3, $4)::text"
            ),
        }
    }
}

pub(super) fn exists_query(schema: Option<&str>, table: &str) -> String {
    // to_regclass takes the name as SQL would parse it: the quoted, folded form.
    let name = pg_table(schema, table).replace('\'', "''");
    format!("SELECT to_regclass('{name}') IS NOT NULL")
}
