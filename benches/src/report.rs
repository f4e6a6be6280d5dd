//! The output: one JSON object per line on stdout, a human summary on stderr.

use serde_json::{json, Map, Value};

use crate::stats::{median, min_max, round, spread_pct};
use crate::Opts;

/// One scenario's results as they come in.
#[derive(Debug)]
pub struct Report {
    scenario: &'static str,
    backend: &'static str,
    mode: &'static str,
    parameters: Value,
    runs: Vec<Map<String, Value>>,
    targets: Vec<Value>,
    completed: bool,
    problems: Vec<String>,
}

impl Report {
    /// Starts the report of `scenario` with these parameters.
    pub fn new(scenario: &'static str, opts: &Opts, parameters: Value) -> Report {
        crate::cpu::watch(opts.backend);
        let report = Report {
            scenario,
            backend: opts.backend.name(),
            mode: opts.mode(),
            parameters,
            runs: Vec::new(),
            targets: Vec::new(),
            completed: true,
            problems: Vec::new(),
        };
        eprintln!(
            "== {scenario} on {} ({} mode, {} run(s)) {}",
            report.backend,
            report.mode,
            opts.runs(),
            report.parameters
        );
        report
    }

    /// Prints one run's figures and keeps them for the summary.
    pub fn run(&mut self, figures: Map<String, Value>) {
        let n = self.runs.len() + 1;
        let line = json!({
            "scenario": self.scenario,
            "backend": self.backend,
            "mode": self.mode,
            "kind": "run",
            "run": n,
            "parameters": self.parameters,
            "figures": figures,
        });
        println!("{line}");
        eprintln!("   run {n}: {}", Value::Object(figures.clone()));
        self.runs.push(figures);
    }

    /// Records that the scenario did not complete correctly (lost or duplicated messages).
    pub fn problem(&mut self, problem: impl Into<String>) {
        let problem = problem.into();
        eprintln!("   PROBLEM: {problem}");
        self.problems.push(problem);
        self.completed = false;
    }

    /// The median over runs of a numeric figure.
    pub fn median(&self, key: &str) -> f64 {
        let values: Vec<f64> = self
            .runs
            .iter()
            .filter_map(|run| run.get(key).and_then(Value::as_f64))
            .collect();
        median(&values)
    }

    /// A target: `value` compared with `limit` (`at_least` or at most).
    pub fn target(&mut self, name: &str, value: f64, limit: f64, at_least: bool) {
        let met = if at_least {
            value >= limit
        } else {
            value <= limit
        };
        self.targets.push(json!({
            "name": name,
            "value": round(value, 3),
            "limit": limit,
            "comparison": if at_least { ">=" } else { "<=" },
            "met": met,
        }));
    }

    /// Prints the summary line; returns whether the scenario completed correctly.
    pub fn finish(self) -> bool {
        let mut keys: Vec<&String> = Vec::new();
        for run in &self.runs {
            for key in run.keys() {
                if !keys.contains(&key) {
                    keys.push(key);
                }
            }
        }
        let mut figures = Map::new();
        for key in keys {
            let values: Vec<f64> = self
                .runs
                .iter()
                .filter_map(|run| run.get(key.as_str()).and_then(Value::as_f64))
                .collect();
            if values.len() == self.runs.len() && !values.is_empty() {
                let (lo, hi) = min_max(&values);
                figures.insert(
                    key.clone(),
                    json!({
                        "median": round(median(&values), 3),
                        "min": round(lo, 3),
                        "max": round(hi, 3),
                        "spread_pct": round(spread_pct(&values), 1),
                    }),
                );
            } else if let Some(last) = self.runs.iter().rev().find_map(|run| run.get(key.as_str()))
            {
                figures.insert(key.clone(), last.clone());
            }
        }
        let target_met = self
            .targets
            .iter()
            .all(|t| t.get("met").and_then(Value::as_bool).unwrap_or(false));
        let line = json!({
            "scenario": self.scenario,
            "backend": self.backend,
            "mode": self.mode,
            "kind": "summary",
            "runs": self.runs.len(),
            "parameters": self.parameters,
            "figures": figures,
            "targets": self.targets,
            "target_met": target_met,
            "completed": self.completed,
            "problems": self.problems,
        });
        println!("{line}");
        eprintln!("   summary (medians over {} run(s)):", self.runs.len());
        for (key, value) in &figures {
            match value.get("median") {
                Some(m) => eprintln!(
                    "     {key:<40} {m:>12}   (spread {}%)",
                    value.get("spread_pct").cloned().unwrap_or(Value::Null)
                ),
                None => {
                    let text = value.to_string();
                    if text.len() <= 300 {
                        eprintln!("     {key:<40} {text}");
                    } else {
                        eprintln!("     {key:<40} (long; see the JSON line)");
                    }
                }
            }
        }
        for target in &self.targets {
            eprintln!(
                "   target {}: {} {} {} -> {}",
                target["name"],
                target["value"],
                target["comparison"].as_str().unwrap_or(""),
                target["limit"],
                if target["met"].as_bool().unwrap_or(false) {
                    "met"
                } else {
                    "NOT met"
                }
            );
        }
        eprintln!(
            "   completed: {}",
            if self.completed { "yes" } else { "NO" }
        );
        self.completed
    }
}
