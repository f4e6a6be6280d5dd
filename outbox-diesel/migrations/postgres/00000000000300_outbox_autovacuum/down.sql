ALTER TABLE outbox_message RESET (
    autovacuum_vacuum_scale_factor,
    autovacuum_vacuum_threshold,
    autovacuum_vacuum_cost_delay,
    autovacuum_analyze_scale_factor,
    autovacuum_analyze_threshold
);
