-- Every message is inserted, leased (updated) and deleted, so the outbox table and its due index
-- fill with dead entries that each claim walks until a vacuum: 500,000 of them made a claim read
-- 18,541 index buffers instead of 6 (BENCHMARKS.md). The default trigger (20 % of the table's
-- rows) never fires on a table that is usually nearly empty; vacuum after every 1,000 dead rows
-- instead, without throttling: the live table stays small, so each vacuum is short.
ALTER TABLE outbox_message SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 1000
);
