//! PostgreSQL statements: prepared once per connection, with `$n` parameters.

use super::pg_text::{pg_ident, pg_table, PG_MS_CEIL, PG_MS_FLOOR, PG_US, PG_UTC};
use super::pg_wait::{PgWaits, WaitTable};
use crate::backends::sql::kinds::{
    holds_table, names_table, owners_table, LONE_READER, MAX_SHARE_OWNERS, OWNER_SEP, PERMIT, READ,
    READ_MARK, SEM_MARK, WRITER,
};

/// Whether the `token` column `col` says that readers hold the key (a lone one or several).
fn readers_hold(col: &str) -> String {
    format!("({col} = '{READ_MARK}' OR {col} LIKE '{LONE_READER}%')")
}

/// The SQL text of one backend instance.
#[derive(Debug, Clone)]
pub(crate) struct Pg {
    /// Creation of the table (and schema), run under an advisory transaction lock.
    pub(crate) create: Vec<String>,
    /// One row: whether the table exists, whether its side table does, whether the holders'
    /// descriptions have their place (native: the `owner` columns; Spring: the owners table).
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
    /// `$1` region: every held key of the region.
    pub(crate) list: String,
    /// The shared kinds (native layout only).
    pub(crate) kinds: Option<PgKinds>,
    /// Spring layout: the statements for a table without `<table>_OWNERS` (made by Spring,
    /// with `create_table=false`), which record no description and show the `CLIENT_ID`.
    pub(crate) undescribed: Option<Undescribed>,
    /// `$1` LOCK_KEY, `$2` REGION, `$3` the key: remembers a key's name for `list` (Spring
    /// layout only, where `LOCK_KEY` is an MD5 UUID).
    pub(crate) name_key: Option<String>,
    /// The wait table's statements (see `pg_wait`).
    pub(crate) waits: PgWaits,
}

/// [`Pg::undescribed`]: the same parameters and results as the statements they replace.
#[derive(Debug, Clone)]
pub(crate) struct Undescribed {
    pub(crate) acquire: String,
    pub(crate) release: String,
    pub(crate) inspect: String,
    pub(crate) list: String,
}

/// The statements of read holds, permits and waiting writers (see `sql::kinds`).
///
/// A share is taken, given back and removed by force in a transaction whose first statement
/// locks the key's row (`lock_row`): every change to a key's holds is made under that row
/// lock, and the statement after it (in READ COMMITTED, with a snapshot of its own) sees all
/// of them. One statement could not: its snapshot is taken before it waits for the row lock.
/// The transaction's four statements (`BEGIN`, the lock, the work, `COMMIT`) are sent in one
/// pipeline: one round trip.
#[derive(Debug, Clone)]
pub(crate) struct PgKinds {
    pub(crate) begin: &'static str,
    pub(crate) commit: &'static str,
    /// `$1` region, `$2` key: creates the key's row (free) if missing, and locks it.
    pub(crate) lock_row: String,
    /// A lone reader's hold in the key's row (see `kinds::LONE_READER`); its release and
    /// renewal are the mutex statements with the reader's id as the token.
    pub(crate) acquire_lone: String,
    /// The share statements after `lock_row`, and on their own (`_now`, see
    /// [`acquire_share`]).
    pub(crate) acquire_share: String,
    pub(crate) acquire_share_now: String,
    pub(crate) release_share: String,
    pub(crate) release_share_now: String,
    pub(crate) extend_share: String,
    pub(crate) force_delete: String,
    /// A waiting exclusive attempt (`AcquireMode::Queue`) whose `acquire_existing` found
    /// readers in takes (or renews) a place, and gives it back when it acquires.
    pub(crate) writer_place: String,
    pub(crate) unplace: String,
    pub(crate) leave: String,
}

/// The first of a layout's creating statements: its schema's, when it names one.
pub(super) fn schema_first(schema: Option<&str>) -> Vec<String> {
    schema
        .map(|s| format!("CREATE SCHEMA IF NOT EXISTS {}", pg_ident(s)))
        .into_iter()
        .collect()
}

/// A side table of Spring's layout, keyed as its lock rows are, with `columns` (each followed
/// by a comma) between the key and the primary key.
fn spring_side_table(name: &str, columns: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {name} (
                LOCK_KEY CHAR(36) NOT NULL,
                REGION VARCHAR(100) NOT NULL,
                {columns}
                PRIMARY KEY (LOCK_KEY, REGION)
            )"
    )
}

impl Pg {
    /// Adds the wait table (see `pg_wait`) to the statements: its creation, its existence as
    /// the fourth column of `exists`, and its statements (see [`WaitTable::new`] for `rels`
    /// and `peek`).
    pub(crate) fn with_waits(
        mut self,
        schema: Option<&str>,
        table: &str,
        rels: (&str, Option<&str>),
        peek: String,
    ) -> Self {
        let t = WaitTable::new(schema, table, rels, peek);
        self.create.push(t.create);
        self.exists = format!(
            "SELECT e.*, to_regclass('{}') IS NOT NULL FROM ({}) AS e",
            t.name.replace('\'', "''"),
            self.exists
        );
        self.waits = t.waits;
        self
    }

    /// Native layout. Parameters: see each statement.
    pub(crate) fn native(schema: Option<&str>, table: &str) -> Self {
        let t = pg_table(schema, table);
        let free = format!(
            "(l.token IS NULL OR l.token = excluded.token OR l.expires_ms <= {PG_MS_FLOOR})"
        );
        let readers = readers_hold("token");
        let mut create = schema_first(schema);
        create.push(format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                region TEXT NOT NULL,
                lock_key TEXT NOT NULL,
                token TEXT NULL,
                fence BIGINT NOT NULL,
                created_ms BIGINT NOT NULL,
                expires_ms BIGINT NOT NULL,
                wanted_ms BIGINT NULL,
                owner TEXT NULL,
                PRIMARY KEY (region, lock_key)
            )"
        ));
        let side = holds_table(table);
        let h = pg_table(schema, &side);
        create.push(format!(
            "CREATE TABLE IF NOT EXISTS {h} (
                region TEXT NOT NULL,
                lock_key TEXT NOT NULL,
                token TEXT NOT NULL,
                kind TEXT NOT NULL,
                permits INTEGER NOT NULL,
                expires_ms BIGINT NOT NULL,
                fence BIGINT NOT NULL,
                owner TEXT NULL,
                PRIMARY KEY (region, lock_key, token)
            )"
        ));
        // Tables made before the holders' descriptions were recorded.
        for x in [&t, &h] {
            create.push(format!(
                "ALTER TABLE {x} ADD COLUMN IF NOT EXISTS owner TEXT NULL"
            ));
        }
        let kinds = native_kinds(&t, &h);
        // `release` as the wait table's hand-over takes it (see `pg_wait`).
        let rel = format!(
            "rel AS (
                 UPDATE {t} SET token = NULL, owner = NULL
                 WHERE region = $1 AND lock_key = $2 AND token = $3
                   AND expires_ms > {PG_MS_FLOOR}
                 RETURNING COALESCE(wanted_ms > {PG_MS_FLOOR}, false) AS contended,
                     COALESCE(wanted_ms > {PG_MS_FLOOR}, false) AS bell
             )"
        );
        Pg {
            create,
            exists: exists_query(schema, table, &side, Owners::Columns),
            // $1 region, $2 key, $3 token, $4 lease ms, $5 want window ms, $6 owner. A plain UPDATE costs
            // about a third less than the upsert below when the row exists, which it does after
            // the key's first use. It always writes the row (also when busy), so that "no row"
            // can only mean a missing row... or a busy row whose stamp is fresh, see WHERE (a row
            // readers hold is always written, so that a waiting writer learns that they do).
            // Returns (ours, fence, remaining ms, readers hold it).
            acquire_existing: Some(acquire_existing(
                &t,
                &format!(
                    "token = $3, fence, expires_ms - {PG_MS_CEIL}, {}",
                    readers_hold("token")
                ),
            )),
            // $1 region, $2 key, $3 token, $4 lease ms, $5 want window ms, $6 owner.
            // Takes a free, expired or own row; on a busy row only (re)stamps `wanted_ms` when
            // less than half of the window is left, else writes nothing and returns no row.
            // Returns (ours, fence, remaining ms of the holder, readers hold it).
            acquire: format!(
                "INSERT INTO {t} AS l (region, lock_key, token, fence, created_ms, expires_ms, wanted_ms, owner)
                 VALUES ($1, $2, $3, {PG_US}, {PG_MS_CEIL}, {PG_MS_CEIL} + $4::bigint, NULL, $6::text)
                 ON CONFLICT (region, lock_key) DO UPDATE SET
                     token = CASE WHEN {free} THEN excluded.token ELSE l.token END,
                     owner = CASE WHEN {free} THEN excluded.owner ELSE l.owner END,
                     fence = CASE WHEN {free} THEN GREATEST(l.fence + 1, excluded.fence) ELSE l.fence END,
                     created_ms = CASE WHEN {free} THEN excluded.created_ms ELSE l.created_ms END,
                     expires_ms = CASE WHEN {free} THEN excluded.expires_ms ELSE l.expires_ms END,
                     wanted_ms = CASE WHEN {free} THEN l.wanted_ms
                                      ELSE excluded.created_ms + $5::bigint END
                 WHERE {free} OR l.wanted_ms IS NULL
                    OR l.wanted_ms < excluded.created_ms + $5::bigint / 2
                 RETURNING token = $3, fence, expires_ms - {PG_MS_CEIL}, {readers}"
            ),
            // $1 region, $2 key, $3 token, $4 channel, $5 payload. Returns (contended) when
            // released; notifies listeners in the same statement when a waiter stamped the row.
            release: format!(
                "UPDATE {t} SET token = NULL, owner = NULL
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
            // $1 region, $2 key. Returns (token, fence, remaining ms, shares, permits,
            // longest share's remaining ms, waiting writers, shares' owners, owner) when held.
            inspect: format!(
                "SELECT l.token, l.fence, l.expires_ms - {PG_MS_CEIL}, {}, l.owner
                 FROM {t} l
                 WHERE l.region = $1 AND l.lock_key = $2 AND l.token IS NOT NULL
                   AND l.expires_ms > {PG_MS_FLOOR}",
                summary(&h)
            ),
            // $1 region. Returns (key, then as inspect) per held key.
            list: format!(
                "SELECT l.lock_key, l.token, l.fence, l.expires_ms - {PG_MS_CEIL}, {}, l.owner
                 FROM {t} l
                 WHERE l.region = $1 AND l.token IS NOT NULL AND l.expires_ms > {PG_MS_FLOOR}",
                summary(&h)
            ),
            kinds: Some(kinds),
            name_key: None,
            undescribed: None,
            // $1 region, $2 key, $3 channel, $4 payload.
            force_delete: format!(
                "UPDATE {t} SET token = NULL, owner = NULL
                 WHERE region = $1 AND lock_key = $2 AND token IS NOT NULL
                   AND expires_ms > {PG_MS_FLOOR}
                 RETURNING pg_notify($3, $4)::text"
            ),
            waits: PgWaits::default(),
        }
        .with_waits(
            schema,
            table,
            (&rel, None),
            format!(
                "SELECT token = $3, expires_ms - {PG_MS_CEIL}, {readers} FROM {t}
                 WHERE region = $1 AND lock_key = $2 AND token IS NOT NULL
                   AND expires_ms > {PG_MS_FLOOR}"
            ),
        )
    }

    /// Spring's `INT_LOCK` layout; `$1` is always the `LOCK_KEY`, `$2` the `REGION`, `$3` the
    /// `CLIENT_ID`, in the same roles as in [`native`](Self::native) otherwise.
    pub(crate) fn spring(schema: Option<&str>, table: &str) -> Self {
        let t = pg_table(schema, table);
        let fence = "(EXTRACT(EPOCH FROM CREATED_DATE) * 1000000)::bigint";
        let remaining =
            format!("ceil(EXTRACT(EPOCH FROM (EXPIRED_AFTER - {PG_UTC})) * 1000)::bigint");
        let lease = "($4::bigint * INTERVAL '1 millisecond')";
        let mut create = schema_first(schema);
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
        let side = names_table(table);
        let names = pg_table(schema, &side);
        create.push(spring_side_table(&names, "LOCK_NAME TEXT NOT NULL,"));
        let owners_name = owners_table(table);
        let owners = pg_table(schema, &owners_name);
        create.push(spring_side_table(
            &owners,
            "CLIENT_ID CHAR(36) NOT NULL,
                OWNER TEXT NOT NULL,",
        ));
        let undescribed = Undescribed {
            acquire: format!(
                "INSERT INTO {t} AS l (LOCK_KEY, REGION, CLIENT_ID, CREATED_DATE, EXPIRED_AFTER)
                 VALUES ($1, $2, $3, {PG_UTC}, {PG_UTC} + {lease})
                 ON CONFLICT (LOCK_KEY, REGION) DO UPDATE SET
                     CLIENT_ID = excluded.CLIENT_ID,
                     CREATED_DATE = excluded.CREATED_DATE,
                     EXPIRED_AFTER = excluded.EXPIRED_AFTER
                 WHERE l.CLIENT_ID = excluded.CLIENT_ID OR l.EXPIRED_AFTER < excluded.CREATED_DATE
                 RETURNING CLIENT_ID = $3 AND $5::bigint IS NOT NULL AND $6::text IS NOT NULL,
                     {fence}, {remaining}"
            ),
            release: format!(
                "DELETE FROM {t}
                 WHERE LOCK_KEY = $1 AND REGION = $2 AND CLIENT_ID = $3
                   AND EXPIRED_AFTER >= {PG_UTC}
                 RETURNING false, pg_notify($4, $5)::text"
            ),
            inspect: format!(
                "SELECT {fence}, {remaining}, NULL::text, l.CLIENT_ID::text FROM {t} l
                 WHERE LOCK_KEY = $1 AND REGION = $2 AND EXPIRED_AFTER >= {PG_UTC}"
            ),
            list: format!(
                "SELECT n.LOCK_NAME, l.LOCK_KEY::text, {fence}, {remaining}, NULL::text,
                        l.CLIENT_ID::text
                 FROM {t} l
                 LEFT JOIN {names} n ON n.LOCK_KEY = l.LOCK_KEY AND n.REGION = l.REGION
                 WHERE l.REGION = $1 AND l.EXPIRED_AFTER >= {PG_UTC}"
            ),
        };
        // A holder's description: distlock's for the CLIENT_ID it wrote, else (a Spring
        // client's hold) nothing, and the reader shows the CLIENT_ID.
        let described = format!(
            "(SELECT o.OWNER FROM {owners} o
              WHERE o.LOCK_KEY = l.LOCK_KEY AND o.REGION = l.REGION AND o.CLIENT_ID = l.CLIENT_ID),
             l.CLIENT_ID::text"
        );
        // `release` and `undescribed.release` as the wait table's hand-over takes them; Spring's
        // table has no mark of a waiter, so a release without a waiter's entry always notifies.
        let mine = format!(
            "LOCK_KEY = $1 AND REGION = $2 AND CLIENT_ID = $3 AND EXPIRED_AFTER >= {PG_UTC}"
        );
        let rel = format!(
            "d AS (DELETE FROM {t} WHERE {mine} RETURNING 1),
             o AS (DELETE FROM {owners} WHERE LOCK_KEY = $1 AND REGION = $2 AND CLIENT_ID = $3),
             rel AS (SELECT false AS contended, true AS bell FROM d)"
        );
        let rel_undescribed = format!(
            "rel AS (DELETE FROM {t} WHERE {mine} RETURNING false AS contended, true AS bell)"
        );
        Pg {
            create,
            exists: exists_query(schema, table, &side, Owners::Table(&owners_name)),
            acquire_existing: None,
            // $1 key, $2 region, $3 client id, $4 lease ms, $5 unused (want window), $6 owner.
            // The description goes to the owners table in the same statement.
            acquire: format!(
                "WITH a AS (
                     INSERT INTO {t} AS l (LOCK_KEY, REGION, CLIENT_ID, CREATED_DATE, EXPIRED_AFTER)
                     VALUES ($1, $2, $3, {PG_UTC}, {PG_UTC} + {lease})
                     ON CONFLICT (LOCK_KEY, REGION) DO UPDATE SET
                         CLIENT_ID = excluded.CLIENT_ID,
                         CREATED_DATE = excluded.CREATED_DATE,
                         EXPIRED_AFTER = excluded.EXPIRED_AFTER
                     WHERE l.CLIENT_ID = excluded.CLIENT_ID
                        OR l.EXPIRED_AFTER < excluded.CREATED_DATE
                     RETURNING CLIENT_ID = $3 AND $5::bigint IS NOT NULL AS ours,
                         {fence} AS fence, {remaining} AS remaining
                 ), o AS (
                     INSERT INTO {owners} (LOCK_KEY, REGION, CLIENT_ID, OWNER)
                     SELECT $1, $2, $3, $6::text FROM a WHERE a.ours
                     ON CONFLICT (LOCK_KEY, REGION) DO UPDATE SET
                         CLIENT_ID = excluded.CLIENT_ID, OWNER = excluded.OWNER
                 )
                 SELECT ours, fence, remaining FROM a"
            ),
            // $1 key, $2 region, $3 client id, $4 channel, $5 payload. The description goes
            // with the hold.
            release: format!(
                "WITH d AS (
                     DELETE FROM {t}
                     WHERE LOCK_KEY = $1 AND REGION = $2 AND CLIENT_ID = $3
                       AND EXPIRED_AFTER >= {PG_UTC}
                     RETURNING 1
                 ), o AS (
                     DELETE FROM {owners} WHERE LOCK_KEY = $1 AND REGION = $2 AND CLIENT_ID = $3
                 )
                 SELECT false, pg_notify($4, $5)::text FROM d"
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
            // Returns (fence, remaining ms, distlock's description, CLIENT_ID).
            inspect: format!(
                "SELECT {fence}, {remaining}, {described} FROM {t} l
                 WHERE LOCK_KEY = $1 AND REGION = $2 AND EXPIRED_AFTER >= {PG_UTC}"
            ),
            // $1 region. Returns (key, LOCK_KEY, fence, remaining ms, description, CLIENT_ID)
            // per held key; the key is NULL for a key whose name nobody recorded (a Spring
            // client's).
            list: format!(
                "SELECT n.LOCK_NAME, l.LOCK_KEY::text, {fence}, {remaining}, {described} FROM {t} l
                 LEFT JOIN {names} n ON n.LOCK_KEY = l.LOCK_KEY AND n.REGION = l.REGION
                 WHERE l.REGION = $1 AND l.EXPIRED_AFTER >= {PG_UTC}"
            ),
            kinds: None,
            undescribed: Some(undescribed),
            name_key: Some(format!(
                "INSERT INTO {names} (LOCK_KEY, REGION, LOCK_NAME) VALUES ($1, $2, $3)
                 ON CONFLICT (LOCK_KEY, REGION) DO NOTHING"
            )),
            // $1 key, $2 region, $3 channel, $4 payload.
            force_delete: format!(
                "DELETE FROM {t} WHERE LOCK_KEY = $1 AND REGION = $2
                 RETURNING pg_notify($3, $4)::text"
            ),
            waits: PgWaits::default(),
        }
        .with_waits(
            schema,
            table,
            (&rel, Some(&rel_undescribed)),
            format!(
                "SELECT CLIENT_ID = $3, {remaining}, false FROM {t}
                 WHERE LOCK_KEY = $1 AND REGION = $2 AND EXPIRED_AFTER >= {PG_UTC}"
            ),
        )
    }
}

/// Where a layout keeps its holders' descriptions.
pub(super) enum Owners<'a> {
    /// An `owner` column in the lease and holds tables.
    Columns,
    /// A table of its own.
    Table(&'a str),
}

/// Whether the lease table and its side table exist, and whether the descriptions have their
/// place: one row of three booleans.
pub(super) fn exists_query(
    schema: Option<&str>,
    table: &str,
    side: &str,
    owners: Owners<'_>,
) -> String {
    // to_regclass takes the name as SQL would parse it: the quoted, folded form.
    let name = |t: &str| pg_table(schema, t).replace('\'', "''");
    let has_owner = |t: &str| {
        format!(
            "EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('{}')
                     AND attname = 'owner' AND NOT attisdropped)",
            name(t)
        )
    };
    let described = match owners {
        Owners::Columns => format!("{} AND {}", has_owner(table), has_owner(side)),
        Owners::Table(o) => format!("to_regclass('{}') IS NOT NULL", name(o)),
    };
    format!(
        "SELECT to_regclass('{}') IS NOT NULL, to_regclass('{}') IS NOT NULL, {described}",
        name(table),
        name(side)
    )
}

/// [`exists_query`] of a layout with one table (ShedLock's): no side table, no place for
/// descriptions to miss.
pub(super) fn exists_query_of(schema: Option<&str>, table: &str) -> String {
    let name = pg_table(schema, table).replace('\'', "''");
    format!("SELECT to_regclass('{name}') IS NOT NULL, true, true")
}

/// The common acquisition's `UPDATE` of an existing row (see [`Pg::acquire_existing`]),
/// returning `returning`.
fn acquire_existing(t: &str, returning: &str) -> String {
    let free_old = format!("(l.token IS NULL OR l.token = $3 OR l.expires_ms <= {PG_MS_FLOOR})");
    format!(
        "UPDATE {t} AS l SET
             token = CASE WHEN {free_old} THEN $3 ELSE l.token END,
             fence = CASE WHEN {free_old} THEN GREATEST(l.fence + 1, {PG_US}) ELSE l.fence END,
             created_ms = CASE WHEN {free_old} THEN {PG_MS_CEIL} ELSE l.created_ms END,
             expires_ms = CASE WHEN {free_old} THEN {PG_MS_CEIL} + $4::bigint
                               ELSE l.expires_ms END,
             wanted_ms = CASE WHEN {free_old} THEN l.wanted_ms
                              ELSE {PG_MS_CEIL} + $5::bigint END,
             owner = CASE WHEN {free_old} THEN $6::text ELSE l.owner END
         WHERE region = $1 AND lock_key = $2
           AND ({free_old} OR l.wanted_ms IS NULL
                OR l.wanted_ms < {PG_MS_CEIL} + $5::bigint / 2 OR {readers})
         RETURNING {returning}",
        readers = readers_hold("l.token")
    )
}

/// The holds of the key of row `l` summed up: (live shares, their permits, the longest
/// share's remaining ms, live waiting writers).
fn summary(h: &str) -> String {
    let live =
        format!("x.region = l.region AND x.lock_key = l.lock_key AND x.expires_ms > {PG_MS_FLOOR}");
    format!(
        "(SELECT count(*) FROM {h} x WHERE {live} AND x.kind IN ('{READ}', '{PERMIT}')),
         (SELECT max(x.permits)::bigint FROM {h} x WHERE {live} AND x.kind = '{PERMIT}'),
         (SELECT max(x.expires_ms) FROM {h} x WHERE {live} AND x.kind IN ('{READ}', '{PERMIT}'))
             - {PG_MS_CEIL},
         (SELECT count(*) FROM {h} x WHERE {live} AND x.kind = '{WRITER}'),
         (SELECT string_agg(o.owner, chr({sep})) FROM
             (SELECT COALESCE(x.owner, '') AS owner FROM {h} x
              WHERE {live} AND x.kind IN ('{READ}', '{PERMIT}') LIMIT {MAX_SHARE_OWNERS}) o)",
        sep = OWNER_SEP as u32
    )
}

/// The start of a share statement: `m`, the key's row as the statement's snapshot has it.
/// After `lock_row` (`now` false) that is the row as it is. On its own (`now` true) the
/// statement locks the row itself (`lockm`, which sees the row's latest version) and takes
/// `m` only if the snapshot has that version (`xmin`, the transaction that wrote it): every
/// change to a key's shares writes its row, so an unchanged row means that the snapshot's
/// holds are the current ones too; otherwise `m` is empty, the statement changes nothing and
/// reports itself unsettled, and the caller runs it after `lock_row`. `cols` are the row's
/// columns `m` carries.
fn share_head(t: &str, cols: &str, now: bool) -> String {
    if now {
        format!(
            "lockm AS (
                 SELECT xmin AS v FROM {t} WHERE region = $1 AND lock_key = $2 FOR UPDATE
             ), snap AS (
                 SELECT xmin AS v, {cols} FROM {t} WHERE region = $1 AND lock_key = $2
             ), m AS (
                 SELECT {cols} FROM snap, lockm WHERE snap.v = lockm.v
             )"
        )
    } else {
        format!("m AS (SELECT {cols} FROM {t} WHERE region = $1 AND lock_key = $2)")
    }
}

/// $1 region, $2 key, $3 token, $4 lease ms, $5 want window ms, $6 kind ('r'/'s'), $7 permits
/// (0 for readers), $8 the row's share mark, $9 the holder's description. Takes a share when the token holds one already
/// (a repeated attempt), or when the row is free, expired or marked for this kind (for a
/// reader: or held by a lone reader) and nothing keeps the attempt out: a live waiting writer
/// keeps readers out, a full semaphore or holders with other permits keep permits out. A lone
/// reader in the row moves into the holds table then. Otherwise only stamps `wanted_ms`, as the
/// mutex does.
/// Always one row: (settled, taken, fence, other holders' permits, remaining ms of the row);
/// see [`share_head`] for `settled`.
fn acquire_share(t: &str, h: &str, now: bool) -> String {
    let (floor, ceil, us) = (PG_MS_FLOOR, PG_MS_CEIL, PG_US);
    let head = share_head(t, "token, fence, expires_ms, owner", now);
    format!(
        "WITH {head}, h AS (
             SELECT token, kind, permits, expires_ms FROM {h}
             WHERE region = $1 AND lock_key = $2 AND expires_ms > {floor}
         ), v AS (
             SELECT
                 (EXISTS (SELECT 1 FROM h WHERE token = $3 AND kind = $6::text)
                  OR COALESCE(m.token = $3 AND m.expires_ms > {floor}, false)) AS mine,
                 (SELECT max(permits) FROM h
                  WHERE kind = '{PERMIT}' AND permits <> $7::int AND token <> $3) AS other,
                 (m.token IS NULL OR m.expires_ms <= {floor} OR m.token = $8::text
                  OR ($6::text = '{READ}' AND m.token LIKE '{LONE_READER}%')) AS free,
                 COALESCE($6::text = '{READ}' AND m.token LIKE '{LONE_READER}%'
                          AND m.expires_ms > {floor}, false) AS lone,
                 (SELECT count(*) FROM h WHERE kind = $6::text AND token <> $3) AS holders,
                 GREATEST(
                     (SELECT max(expires_ms) FROM h WHERE kind = $6::text AND token <> $3),
                     CASE WHEN $6::text = '{READ}' AND m.token LIKE '{LONE_READER}%'
                               AND m.token <> $3 THEN m.expires_ms END) AS until,
                 EXISTS (SELECT 1 FROM h WHERE kind = '{WRITER}') AS writer_waits,
                 GREATEST(m.fence + 1, {us}) AS next,
                 m.expires_ms - {ceil} AS remaining
             FROM m
         ), d AS (
             SELECT v.*, (mine OR (free AND other IS NULL
                                   AND ($7::int = 0 OR holders < $7::int)
                                   AND NOT ($6::text = '{READ}' AND writer_waits))) AS ok
             FROM v
         ), ins AS (
             INSERT INTO {h} (region, lock_key, token, kind, permits, expires_ms, fence, owner)
             SELECT $1, $2, $3, $6::text, $7::int, {ceil} + $4::bigint, next, $9::text
             FROM d WHERE ok
             ON CONFLICT (region, lock_key, token) DO UPDATE SET
                 kind = excluded.kind, permits = excluded.permits,
                 expires_ms = excluded.expires_ms, fence = excluded.fence, owner = excluded.owner
         ), mig AS (
             INSERT INTO {h} (region, lock_key, token, kind, permits, expires_ms, fence, owner)
             SELECT $1, $2, m.token, '{READ}', 0, m.expires_ms, m.fence, m.owner FROM m, d
             WHERE d.ok AND d.lone AND m.token <> $3
             ON CONFLICT (region, lock_key, token) DO UPDATE SET
                 kind = excluded.kind, permits = excluded.permits,
                 expires_ms = excluded.expires_ms, fence = excluded.fence, owner = excluded.owner
         ), upd AS (
             UPDATE {t} AS l SET
                 token = CASE WHEN d.ok THEN $8::text ELSE l.token END,
                 fence = CASE WHEN d.ok THEN d.next ELSE l.fence END,
                 created_ms = CASE WHEN d.ok THEN {ceil} ELSE l.created_ms END,
                 expires_ms = CASE WHEN d.ok
                                   THEN GREATEST(COALESCE(d.until, 0), {ceil} + $4::bigint)
                                   ELSE l.expires_ms END,
                 wanted_ms = CASE WHEN d.ok THEN l.wanted_ms ELSE {ceil} + $5::bigint END
             FROM d
             WHERE l.region = $1 AND l.lock_key = $2
               AND (d.ok OR l.wanted_ms IS NULL OR l.wanted_ms < {ceil} + $5::bigint / 2)
         ), prune AS (
             DELETE FROM {h}
             WHERE region = $1 AND lock_key = $2 AND expires_ms <= {floor} AND token <> $3
               AND token IS DISTINCT FROM (SELECT token FROM m) AND EXISTS (SELECT 1 FROM m)
         )
         SELECT EXISTS (SELECT 1 FROM m), d.ok, d.next, d.other::bigint, d.remaining
         FROM (SELECT 1) AS one LEFT JOIN d ON true"
    )
}

/// $1 region, $2 key, $3 token, $4 channel, $5 payload. Gives a live share back: the row
/// keeps the longest lease of the shares left, or is free; waiters are notified when a waiter
/// stamped the row. Removes whatever expired on the way. Returns (settled, released,
/// contended); see [`share_head`] for `settled`. Released means that the share was live and
/// the row still marked shared (a row deleted underneath lost every share with it).
fn release_share(t: &str, h: &str, now: bool) -> String {
    let floor = PG_MS_FLOOR;
    let shares = format!("kind IN ('{READ}', '{PERMIT}')");
    let marks = format!("('{READ_MARK}', '{SEM_MARK}')");
    let head = share_head(t, "1 AS one", now);
    format!(
        "WITH {head}, gone AS (
             DELETE FROM {h}
             WHERE region = $1 AND lock_key = $2 AND (token = $3 OR expires_ms <= {floor})
               AND EXISTS (SELECT 1 FROM m)
             RETURNING token = $3 AND {shares} AND expires_ms > {floor} AS mine
         ), rest AS (
             SELECT max(expires_ms) AS until FROM {h}
             WHERE region = $1 AND lock_key = $2 AND token <> $3 AND {shares}
               AND expires_ms > {floor}
         ), upd AS (
             UPDATE {t} AS l SET
                 token = CASE WHEN rest.until IS NULL THEN NULL ELSE l.token END,
                 expires_ms = COALESCE(rest.until, l.expires_ms)
             FROM rest
             WHERE l.region = $1 AND l.lock_key = $2 AND l.token IN {marks}
               AND EXISTS (SELECT 1 FROM gone WHERE mine)
             RETURNING COALESCE(l.wanted_ms > {floor}, false) AS wanted
         ), w AS (
             SELECT EXISTS (SELECT 1 FROM m) AS settled,
                    EXISTS (SELECT 1 FROM upd) AS released,
                    COALESCE((SELECT wanted FROM upd), false) AS wanted
         )
         SELECT settled, released, wanted, CASE WHEN wanted THEN pg_notify($4, $5)::text END
         FROM w"
    )
}

/// The statements of the shared kinds on lease table `t` and holds table `h`.
fn native_kinds(t: &str, h: &str) -> PgKinds {
    let (floor, ceil) = (PG_MS_FLOOR, PG_MS_CEIL);
    let shares = format!("kind IN ('{READ}', '{PERMIT}')");
    let marks = format!("('{READ_MARK}', '{SEM_MARK}')");
    PgKinds {
        begin: "BEGIN ISOLATION LEVEL READ COMMITTED",
        commit: "COMMIT",
        // Locks an existing row without writing it (ON CONFLICT locks the row whether or not
        // the WHERE lets it be updated).
        lock_row: format!(
            "INSERT INTO {t} AS l (region, lock_key, token, fence, created_ms, expires_ms, wanted_ms)
             VALUES ($1, $2, NULL, 0, 0, 0, NULL)
             ON CONFLICT (region, lock_key) DO UPDATE SET token = l.token WHERE false"
        ),
        // $1 region, $2 key, $3 the reader's id, $4 lease ms, $5 owner. Takes a free or expired row
        // that no waiting writer keeps readers out of (or renews the reader's own); returns
        // (fence) when it did. Nothing else is written: a busy row is left to `acquire_share`.
        acquire_lone: format!(
            "UPDATE {t} AS l SET
                 token = $3, fence = GREATEST(l.fence + 1, {us}), created_ms = {ceil},
                 expires_ms = {ceil} + $4::bigint, owner = $5::text
             WHERE region = $1 AND lock_key = $2
               AND (l.token = $3
                    OR ((l.token IS NULL OR l.expires_ms <= {floor})
                        AND NOT EXISTS (SELECT 1 FROM {h} x
                                        WHERE x.region = $1 AND x.lock_key = $2
                                          AND x.kind = '{WRITER}' AND x.expires_ms > {floor})))
             RETURNING fence",
            us = PG_US,
        ),
        acquire_share: acquire_share(t, h, false),
        acquire_share_now: acquire_share(t, h, true),
        release_share: release_share(t, h, false),
        release_share_now: release_share(t, h, true),
        // $1 region, $2 key, $3 token, $4 lease ms. One statement: it locks the key's row
        // first (the one-time filter of `h` runs `m` before any hold is touched), then renews
        // the share, then raises the row's lease to it. Returns a row when renewed.
        extend_share: format!(
            "WITH m AS (
                 SELECT 1 FROM {t}
                 WHERE region = $1 AND lock_key = $2 AND token IN {marks} FOR UPDATE
             ), h AS (
                 UPDATE {h} SET expires_ms = {ceil} + $4::bigint
                 WHERE region = $1 AND lock_key = $2 AND token = $3 AND {shares}
                   AND expires_ms > {floor} AND EXISTS (SELECT 1 FROM m)
                 RETURNING expires_ms
             )
             UPDATE {t} AS l SET expires_ms = GREATEST(l.expires_ms, h.expires_ms) FROM h
             WHERE l.region = $1 AND l.lock_key = $2
             RETURNING 1"
        ),
        // $1 region, $2 key, $3 channel, $4 payload. After `lock_row`. Every holder goes;
        // returns whether one was live.
        force_delete: format!(
            "WITH gone AS (
                 DELETE FROM {h}
                 WHERE region = $1 AND lock_key = $2 AND ({shares} OR expires_ms <= {floor})
                 RETURNING {shares} AND expires_ms > {floor} AS live
             ), freed AS (
                 UPDATE {t} SET token = NULL, owner = NULL
                 WHERE region = $1 AND lock_key = $2 AND token IS NOT NULL
                 RETURNING expires_ms > {floor} AS live
             )
             SELECT EXISTS (SELECT 1 FROM gone WHERE live) OR EXISTS (SELECT 1 FROM freed WHERE live),
                    pg_notify($3, $4)::text"
        ),
        // $1 region, $2 key, $3 the waiter's token. Takes or renews a waiting writer's place
        // while readers hold the key; a row when it did.
        writer_place: format!(
            "INSERT INTO {h} (region, lock_key, token, kind, permits, expires_ms, fence)
             SELECT $1, $2, $3, '{WRITER}', 0, {ceil} + {place}, 0 FROM {t}
             WHERE region = $1 AND lock_key = $2 AND {readers} AND expires_ms > {floor}
             ON CONFLICT (region, lock_key, token) DO UPDATE SET expires_ms = excluded.expires_ms
             RETURNING 1",
            place = crate::backends::sql::kinds::WRITER_PLACE_MS,
            readers = readers_hold("token"),
        ),
        // $1 region, $2 key, $3 the waiter's token: the place of a writer that acquired.
        unplace: format!(
            "DELETE FROM {h}
             WHERE region = $1 AND lock_key = $2 AND token = $3 AND kind = '{WRITER}'"
        ),
        // $1 region, $2 key, $3 the waiter's token, $4 channel, $5 payload. Wakes the readers
        // the place kept out.
        leave: format!(
            "WITH gone AS (
                 DELETE FROM {h}
                 WHERE region = $1 AND lock_key = $2 AND token = $3 AND kind = '{WRITER}'
                 RETURNING 1
             )
             SELECT pg_notify($4, $5)::text WHERE EXISTS (SELECT 1 FROM gone)"
        ),
    }
}
