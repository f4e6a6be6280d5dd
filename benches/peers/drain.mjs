// One peer's no-op drain, for `outbox-bench peers`: prefills COUNT jobs while no worker runs,
// then starts the peer's worker with the settings its documentation gives for throughput and
// times it until every job is completed in the database. Prints one JSON line on stdout.
//
//   node drain.mjs graphile-worker|pg-boss DATABASE_URL COUNT CONCURRENCY BATCH [STATISTICS]
//
// BATCH is how many jobs the peer fetches at once: graphile-worker's `localQueue.size`,
// pg-boss's `batchSize`. STATISTICS is `analyzed` (the default: after the fill, untimed, the
// database is analyzed and checkpointed, as for every system of the comparison) or `stale`
// (left on the statistics of the empty tables).

const [system, connectionString, countText, concurrencyText, batchText, statisticsText] =
  process.argv.slice(2);
const statistics = statisticsText ?? "analyzed";
const count = Number(countText);
const concurrency = Number(concurrencyText);
const batch = Number(batchText);
const CHUNK = 5000;

function fail(message) {
  console.error(`drain.mjs (${system}): ${message}`);
  process.exit(2);
}

if (
  !connectionString ||
  !(count > 0) ||
  !(concurrency > 0) ||
  !(batch > 0) ||
  !["analyzed", "stale"].includes(statistics)
) {
  fail(
    "usage: node drain.mjs graphile-worker|pg-boss DATABASE_URL COUNT CONCURRENCY BATCH [analyzed|stale]",
  );
}

/** What every system runs after its fill, untimed, unless the statistics are left stale. */
async function prepare(query) {
  if (statistics === "analyzed") {
    await query("ANALYZE");
    await query("CHECKPOINT");
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Waits until the handler has seen every job (counted in this process, as the outbox worker's
 * drain counts its own), then until the database holds none undone (the completions of the
 * last jobs commit after their handler returns); whether both happened within `limitMs`. The
 * database is asked only at the end: a count over the queue's table every few milliseconds
 * would compete with the peer for the server.
 */
async function until(handled, remaining, limitMs) {
  const end = Date.now() + limitMs;
  while (handled() < count) {
    if (Date.now() > end) return false;
    await sleep(1);
  }
  while (Date.now() < end) {
    if ((await remaining()) === 0) return true;
    await sleep(2);
  }
  return false;
}

const limitMs = 60_000 + 5 * count;

async function graphileWorker() {
  const { run, makeWorkerUtils } = await import("graphile-worker");
  const worker = {
    connectionString,
    concurrentJobs: concurrency,
    // The documentation's advice: concurrentJobs + 2 connections.
    maxPoolSize: concurrency + 2,
    pollInterval: 1000,
    // Its performance page: a local queue of jobs fetched in batches, completions batched.
    localQueue: { size: batch },
    completeJobBatchDelay: 0,
  };
  const utils = await makeWorkerUtils({ connectionString });
  // Fresh tables each run, as the outbox's drain gets.
  await utils.withPgClient((c) => c.query("DROP SCHEMA IF EXISTS graphile_worker CASCADE"));
  await utils.migrate();
  for (let n = 0; n < count; n += CHUNK) {
    const specs = [];
    for (let i = n; i < Math.min(count, n + CHUNK); i++) {
      specs.push({ identifier: "noop", payload: { n: i } });
    }
    await utils.addJobs(specs);
  }
  await utils.withPgClient(async (c) => prepare((sql) => c.query(sql)));
  let handled = 0;
  const started = process.hrtime.bigint();
  const runner = await run({
    preset: { worker },
    noHandleSignals: true,
    taskList: {
      noop: async () => {
        handled += 1;
      },
    },
  });
  const remaining = () =>
    utils
      .withPgClient((c) => c.query("SELECT count(*)::int AS n FROM graphile_worker._private_jobs"))
      .then((r) => r.rows[0].n);
  const done = await until(() => handled, remaining, limitMs);
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  await runner.stop();
  await utils.release();
  return { done, seconds, handled };
}

async function pgBoss() {
  const { PgBoss } = await import("pg-boss");
  // Fresh tables each run, as the outbox's drain gets.
  const pg = await import("pg");
  const client = new pg.default.Client({ connectionString });
  await client.connect();
  await client.query("DROP SCHEMA IF EXISTS pgboss CASCADE");
  await client.end();
  const boss = new PgBoss({ connectionString, max: concurrency + 2 });
  boss.on("error", (error) => console.error(`pg-boss: ${error}`));
  await boss.start();
  const queue = "bench-noop";
  await boss.createQueue(queue);
  for (let n = 0; n < count; n += CHUNK) {
    const jobs = [];
    for (let i = n; i < Math.min(count, n + CHUNK); i++) {
      jobs.push({ data: { n: i } });
    }
    await boss.insert(queue, jobs);
  }
  {
    const client = new pg.default.Client({ connectionString });
    await client.connect();
    await prepare((sql) => client.query(sql));
    await client.end();
  }
  let handled = 0;
  const started = process.hrtime.bigint();
  // Its worker options for throughput: batches, a local worker per concurrent job, fetching
  // without a pause while batches come back full.
  await boss.work(
    queue,
    {
      batchSize: batch,
      localConcurrency: concurrency,
      pollingIntervalSeconds: 0.5,
      burstWhenBatchFull: true,
    },
    async (jobs) => {
      handled += jobs.length;
    },
  );
  // Completed jobs stay in the table until retention removes them: count what is not done.
  const remaining = () =>
    boss
      .getDb()
      .executeSql(
        "SELECT count(*)::int AS n FROM pgboss.job WHERE name = $1 AND state < 'completed'",
        [queue],
      )
      .then((r) => r.rows[0].n);
  const done = await until(() => handled, remaining, limitMs);
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  await boss.stop({ graceful: true, wait: true });
  return { done, seconds, handled };
}

const drains = { "graphile-worker": graphileWorker, "pg-boss": pgBoss };
if (!drains[system]) fail(`unknown system ${system}`);
const { readFileSync } = await import("node:fs");
const manifest = new URL(`./node_modules/${system}/package.json`, import.meta.url);
const version = JSON.parse(readFileSync(manifest, "utf8")).version;
const result = await drains[system]();
console.log(
  JSON.stringify({
    system,
    version,
    node: process.version,
    messages: count,
    concurrency,
    batch,
    statistics,
    completed: result.done,
    handled: result.handled,
    seconds: result.seconds,
    per_s: count / result.seconds,
  }),
);
process.exit(result.done && result.handled >= count ? 0 : 1);
