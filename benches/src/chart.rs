//! `chart`: SVG charts drawn from the JSON lines the scenarios print.
//!
//! - `peers` runs: the drain rate of each system and setting, a bar at the median of the runs
//!   with a whisker from the slowest to the fastest run. Several invocations in one file (this
//!   worker at two batch sizes, say) are drawn side by side.
//! - `latency` runs that report intervals (`--hold-transaction`): per interval, what piles up
//!   behind the held transaction (dead tuples, InnoDB's history list, the WAL's bytes), the
//!   claims' time per message and the latency's p99, one line per run.
//!
//! Only the lines with `"kind": "run"` are read; summaries repeat them.

use std::path::PathBuf;

use clap::Args;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde_json::Value;

use crate::stats::{median, min_max};
use crate::{failed, Res, WithContext};

/// What to draw, from where, to where.
#[derive(Args, Debug, Clone)]
pub struct ChartArgs {
    /// A file of JSON lines, as a scenario printed them on stdout (several files may be
    /// concatenated into one).
    #[arg(long)]
    pub input: PathBuf,
    /// The SVG file to write.
    #[arg(long)]
    pub output: PathBuf,
    /// The chart's title (default: the scenario's).
    #[arg(long)]
    pub title: Option<String>,
}

/// Colours that stay apart in print and for the common colour blindnesses (Okabe and Ito).
const PALETTE: [RGBColor; 6] = [
    RGBColor(0, 114, 178),
    RGBColor(230, 159, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(86, 180, 233),
    RGBColor(213, 94, 0),
];

const FONT: &str = "sans-serif";

/// Reads the runs, picks the chart their scenario calls for, writes the SVG.
pub fn run(args: &ChartArgs) -> Res<()> {
    let text =
        std::fs::read_to_string(&args.input).ctx(format!("reading {}", args.input.display()))?;
    let runs = runs(&text)?;
    let scenario = runs[0]["scenario"].as_str().unwrap_or_default().to_owned();
    if let Some(other) = runs.iter().find(|r| r["scenario"] != runs[0]["scenario"]) {
        return Err(failed(format!(
            "{} mixes scenarios ({scenario} and {}): chart one scenario at a time",
            args.input.display(),
            other["scenario"]
        )));
    }
    match scenario.as_str() {
        "peers" => draw_peers(&runs, args),
        "latency" => draw_intervals(&runs, args),
        other => Err(failed(format!(
            "no chart for the {other:?} scenario (charts: peers, latency with \
             --hold-transaction)"
        ))),
    }?;
    eprintln!("chart: wrote {}", args.output.display());
    Ok(())
}

/// The `"kind": "run"` lines of `text`; other lines (summaries, anything not JSON) are skipped.
fn runs(text: &str) -> Res<Vec<Value>> {
    let runs: Vec<Value> = text
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["kind"] == "run")
        .collect();
    if runs.is_empty() {
        return Err(failed(
            "no run lines in the input: give it what a scenario printed on stdout",
        ));
    }
    Ok(runs)
}

/// One bar: a system at one setting, over runs.
struct Bar {
    label: String,
    rates: Vec<f64>,
}

/// The bars of `peers` runs, in the order they first appear: this worker at each batch size
/// among the invocations, then each peer at each of its settings.
fn peer_bars(runs: &[Value]) -> Vec<Bar> {
    let mut bars: Vec<Bar> = Vec::new();
    let mut add = |label: String, rate: f64| match bars.iter_mut().find(|b| b.label == label) {
        Some(bar) => bar.rates.push(rate),
        None => bars.push(Bar {
            label,
            rates: vec![rate],
        }),
    };
    for run in runs {
        let figures = &run["figures"];
        let batch = &run["parameters"]["batch_size"];
        let batch = batch
            .as_str()
            .map_or_else(|| batch.to_string(), str::to_owned);
        if let Some(rate) = figures["outbox_noop_per_s"].as_f64() {
            add(format!("this worker ({batch})"), rate);
        }
        let Some(figures) = figures.as_object() else {
            continue;
        };
        for (key, value) in figures {
            let (Some(rate), Some(rest)) = (value.as_f64(), key.strip_suffix("_per_s")) else {
                continue;
            };
            if let Some((peer, batch)) = rest.split_once("_batch_") {
                add(format!("{} ({batch})", peer.replace('_', "-")), rate);
            }
        }
    }
    // This worker's bars first, whichever invocation they came from (a stable sort).
    bars.sort_by_key(|bar| !bar.label.starts_with("this worker"));
    bars
}

fn draw_peers(runs: &[Value], args: &ChartArgs) -> Res<()> {
    let bars = peer_bars(runs);
    if bars.is_empty() {
        return Err(failed("the peers runs carry no drain rates"));
    }
    let highest = bars
        .iter()
        .flat_map(|b| b.rates.iter().copied())
        .fold(0.0_f64, f64::max);
    let backend = runs[0]["backend"].as_str().unwrap_or_default();
    let messages = &runs[0]["parameters"]["messages"];
    let title = args.title.clone().unwrap_or_else(|| {
        format!("No-op drain of {messages} messages, {backend}: messages/s (median, min-max); (N): batch")
    });
    let root = SVGBackend::new(&args.output, (1200, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_error)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(&title, (FONT, 20))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(
            (0..bars.len().saturating_sub(1)).into_segmented(),
            0.0..highest * 1.15,
        )
        .map_err(draw_error)?;
    let labels: Vec<String> = bars.iter().map(|b| b.label.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(bars.len())
        .x_label_formatter(&|x| match x {
            SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .x_label_style((FONT, 12))
        .y_desc("messages/s")
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(draw_error)?;
    for (i, bar) in bars.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        let middle = median(&bar.rates);
        let (lowest, highest) = min_max(&bar.rates);
        let mut rectangle = Rectangle::new(
            [
                (SegmentValue::Exact(i), 0.0),
                (SegmentValue::Exact(i + 1), middle),
            ],
            colour.mix(0.8).filled(),
        );
        rectangle.set_margin(0, 0, 12, 12);
        chart
            .draw_series([rectangle.into_dyn()])
            .map_err(draw_error)?;
        let centre = SegmentValue::CenterOf(i);
        chart
            .draw_series([
                PathElement::new(
                    vec![(centre.clone(), lowest), (centre.clone(), highest)],
                    BLACK.stroke_width(2),
                )
                .into_dyn(),
                Text::new(
                    format!("{middle:.0}"),
                    (centre, highest + highest_gap(highest)),
                    (FONT, 14)
                        .into_font()
                        .color(&BLACK)
                        .pos(Pos::new(HPos::Center, VPos::Bottom)),
                )
                .into_dyn(),
            ])
            .map_err(draw_error)?;
    }
    root.present().map_err(draw_error)
}

/// Room between a whisker's top and the figure written above it.
fn highest_gap(value: f64) -> f64 {
    value * 0.03
}

/// One line of an interval chart: a run and its intervals.
struct Line {
    label: String,
    intervals: Vec<Value>,
}

fn interval_lines(runs: &[Value]) -> Vec<Line> {
    runs.iter()
        .filter_map(|run| {
            let intervals = run["figures"]["intervals"].as_array()?.clone();
            let backend = run["backend"].as_str().unwrap_or_default();
            let label = match run["figures"]["held_transaction_s"].as_f64() {
                Some(held) => format!("{backend}, a transaction held {held:.0} s"),
                None => format!("{backend}, no transaction held"),
            };
            Some(Line { label, intervals })
        })
        .collect()
}

/// What piles up behind a held transaction, named for the backend.
fn piled_up_name(backend: &str) -> &'static str {
    match backend {
        "mysql" => "InnoDB history list (undo records)",
        "sqlite" => "WAL (bytes)",
        _ => "dead tuples in outbox_message",
    }
}

fn draw_intervals(runs: &[Value], args: &ChartArgs) -> Res<()> {
    let lines = interval_lines(runs);
    if lines.is_empty() {
        return Err(failed(
            "no latency run reports intervals: run latency with --hold-transaction",
        ));
    }
    let backend = runs[0]["backend"].as_str().unwrap_or_default();
    let rate = runs[0]["parameters"]["rate_per_s"]
        .as_f64()
        .unwrap_or_default();
    let title = args
        .title
        .clone()
        .unwrap_or_else(|| format!("{backend} at {rate:.0} messages/s, per interval of the run"));
    let root = SVGBackend::new(&args.output, (960, 900)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_error)?;
    let (top, panels) = root.split_vertically(40);
    top.titled(&title, (FONT, 20)).map_err(draw_error)?;
    let panels = panels.split_evenly((3, 1));
    let series: [(&str, &str); 3] = [
        ("piled_up", piled_up_name(backend)),
        ("claim_us_per_message", "claim time per message (µs)"),
        ("latency_p99_ms", "latency p99 (ms)"),
    ];
    for (i, ((key, name), panel)) in series.iter().zip(panels.iter()).enumerate() {
        // One legend, in the first panel, where a held transaction's pile starts low.
        draw_panel(panel, &lines, key, name, i == 0)?;
    }
    root.present().map_err(draw_error)
}

fn draw_panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    lines: &[Line],
    key: &str,
    name: &str,
    legend: bool,
) -> Res<()> {
    let points: Vec<Vec<(f64, f64)>> = lines
        .iter()
        .map(|line| {
            line.intervals
                .iter()
                .filter_map(|i| {
                    let end = i["interval_end_s"].as_f64()?;
                    let value = i[key].as_f64().filter(|v| *v >= 0.0)?;
                    Some((end / 60.0, value))
                })
                .collect()
        })
        .collect();
    let last_minute = points.iter().flatten().map(|p| p.0).fold(0.0_f64, f64::max);
    let highest = points.iter().flatten().map(|p| p.1).fold(0.0_f64, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption(name, (FONT, 16))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(80)
        .build_cartesian_2d(
            0.0..last_minute.max(f64::MIN_POSITIVE),
            0.0..highest * 1.1 + 1e-9,
        )
        .map_err(draw_error)?;
    chart
        .configure_mesh()
        .x_desc("minutes from the start of the run (interval's end)")
        .y_label_formatter(&|y| short(*y))
        .draw()
        .map_err(draw_error)?;
    for (i, (line, points)) in lines.iter().zip(points).enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        chart
            .draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))
            .map_err(draw_error)?
            .label(line.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour));
        chart
            .draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 3, colour.filled())),
            )
            .map_err(draw_error)?;
    }
    if !legend {
        return Ok(());
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 13))
        .draw()
        .map_err(draw_error)
}

/// 1,080,000 as "1.08M", 2,431 as "2.4k": axis labels that fit.
fn short(value: f64) -> String {
    let size = value.abs();
    if size >= 1e6 {
        format!("{:.2}M", value / 1e6)
    } else if size >= 1e4 {
        format!("{:.0}k", value / 1e3)
    } else if size >= 1e3 {
        format!("{:.1}k", value / 1e3)
    } else if size >= 10.0 || size == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.2}")
    }
}

fn draw_error<E: std::error::Error + Send + Sync + 'static>(
    error: DrawingAreaErrorKind<E>,
) -> Box<dyn std::error::Error + Send + Sync> {
    failed(format!("drawing the chart: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_bars_keep_each_setting_apart_and_collect_its_runs() {
        let text = r#"{"scenario":"peers","backend":"postgres","kind":"run","parameters":{"batch_size":64,"messages":100000},"figures":{"outbox_noop_per_s":29000.0,"graphile_worker_batch_500_per_s":12000.0,"graphile_worker_batch_2000_per_s":24000.0,"graphile_worker_version":"0.18.0","ratio_outbox_over_graphile_worker":1.2}}
not json at all
{"scenario":"peers","backend":"postgres","kind":"summary","figures":{}}
{"scenario":"peers","backend":"postgres","kind":"run","parameters":{"batch_size":64,"messages":100000},"figures":{"outbox_noop_per_s":31000.0,"graphile_worker_batch_500_per_s":13000.0,"graphile_worker_batch_2000_per_s":25000.0}}
{"scenario":"peers","backend":"postgres","kind":"run","parameters":{"batch_size":256,"messages":100000},"figures":{"outbox_noop_per_s":45000.0}}"#;
        let bars = peer_bars(&runs(text).unwrap());
        let labels: Vec<&str> = bars.iter().map(|b| b.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "this worker (64)",
                "this worker (256)",
                "graphile-worker (2000)",
                "graphile-worker (500)",
            ]
        );
        assert_eq!(bars[0].rates, [29000.0, 31000.0]);
        assert_eq!(bars[1].rates, [45000.0]);
    }

    #[test]
    fn input_without_runs_is_refused_with_what_to_give() {
        let error = runs("{\"kind\":\"summary\"}\n").unwrap_err().to_string();
        assert!(error.contains("no run lines"), "{error}");
    }

    #[test]
    fn axis_labels_stay_short() {
        assert_eq!(short(1_080_000.0), "1.08M");
        assert_eq!(short(52_720.0), "53k");
        assert_eq!(short(2_431.0), "2.4k");
        assert_eq!(short(48.8), "49");
        assert_eq!(short(3.125), "3.12");
        assert_eq!(short(0.0), "0");
    }
}
