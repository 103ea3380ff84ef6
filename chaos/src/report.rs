//! Reports of chaos runs: JSON, a Markdown table and an SVG timeline.
//!
//! `write_reports` writes, into one directory, `runs.json` (every run plus a summary per
//! scenario), `report.md` (the summary table, the failures, one row per run) and one
//! `timeline-<scenario>-<run>.svg` per run. The SVGs are hand-written strings: no dependency.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::model::{Event, Run};

/// The files `write_reports` wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reports {
    /// `runs.json`: the summary per scenario and every run.
    pub json: PathBuf,
    /// `report.md`: the Markdown report.
    pub markdown: PathBuf,
    /// One timeline per run, in the order of the runs.
    pub svgs: Vec<PathBuf>,
}

/// The numbers of every run of one scenario.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScenarioSummary {
    /// The scenario's name.
    pub scenario: String,
    /// How many runs.
    pub runs: usize,
    /// How many of them passed.
    pub passed: usize,
    /// RTO, median over the runs that measured one, ms.
    pub rto_p50_ms: Option<u64>,
    /// RTO, 99th percentile, ms (the largest with fewer than 100 runs).
    pub rto_p99_ms: Option<u64>,
    /// RTO, the largest, ms.
    pub rto_max_ms: Option<u64>,
    /// Fault to the lost member judged lost, median, ms.
    pub detect_p50_ms: Option<u64>,
    /// Fault to a new leader, median over the runs that elected one, ms.
    pub elect_p50_ms: Option<u64>,
    /// Acknowledged writes lost, over all runs.
    pub lost_writes: u64,
    /// Of those, acknowledged more than a delta period before the fault (must be 0).
    #[serde(default)]
    pub lost_before_delta_period: u64,
    /// The largest data-loss window the ring reported, ms.
    pub max_data_loss_window_ms: Option<u64>,
    /// Split-brain writes, over all runs.
    pub split_brain_writes: u64,
}

/// The nearest-rank percentile `p` (0 to 100) of `sorted` (ascending): the smallest value with
/// at least `p`% of the values at or below it. `None` when there are no values.
pub fn percentile(sorted: &[u64], p: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let n = sorted.len();
    // `p * n` first, then `/ 100`: exact for whole percentages, so p99 of 100 values is the 99th.
    let rank = (p.clamp(0.0, 100.0) * n as f64 / 100.0).ceil() as usize;
    Some(sorted[rank.clamp(1, n) - 1])
}

/// One summary per scenario, in the order the scenarios first appear in `runs`.
pub fn summarize(runs: &[Run]) -> Vec<ScenarioSummary> {
    let mut groups: Vec<(&str, Vec<&Run>)> = Vec::new();
    for run in runs {
        match groups.iter_mut().find(|(name, _)| *name == run.scenario) {
            Some((_, group)) => group.push(run),
            None => groups.push((&run.scenario, vec![run])),
        }
    }
    groups
        .into_iter()
        .map(|(scenario, group)| {
            // The values present, sorted, for one measure.
            let sorted = |measure: fn(&Run) -> Option<u64>| {
                let mut values: Vec<u64> = group.iter().filter_map(|r| measure(r)).collect();
                values.sort_unstable();
                values
            };
            let rto = sorted(|r| r.measures.rto_ms);
            ScenarioSummary {
                scenario: scenario.to_string(),
                runs: group.len(),
                passed: group.iter().filter(|r| r.passed()).count(),
                rto_p50_ms: percentile(&rto, 50.0),
                rto_p99_ms: percentile(&rto, 99.0),
                rto_max_ms: rto.last().copied(),
                detect_p50_ms: percentile(&sorted(|r| r.measures.detect_ms), 50.0),
                elect_p50_ms: percentile(&sorted(|r| r.measures.elect_ms), 50.0),
                lost_writes: group.iter().map(|r| r.measures.lost_writes).sum(),
                lost_before_delta_period: group
                    .iter()
                    .map(|r| r.measures.lost_before_delta_period)
                    .sum(),
                max_data_loss_window_ms: sorted(|r| r.measures.data_loss_window_ms).last().copied(),
                split_brain_writes: group.iter().map(|r| r.measures.split_brain_writes).sum(),
            }
        })
        .collect()
}

/// The summary table in Markdown, one row per scenario ("-" where nothing was measured).
pub fn markdown_summary(summaries: &[ScenarioSummary]) -> String {
    let mut out = String::from(
        "| scenario | runs | passed | RTO p50 ms | RTO p99 ms | RTO max ms | detect p50 ms \
         | elect p50 ms | lost writes | lost older than a delta period | max loss window ms \
         | split-brain writes |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for s in summaries {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            md_cell(&s.scenario),
            s.runs,
            s.passed,
            opt(s.rto_p50_ms),
            opt(s.rto_p99_ms),
            opt(s.rto_max_ms),
            opt(s.detect_p50_ms),
            opt(s.elect_p50_ms),
            s.lost_writes,
            s.lost_before_delta_period,
            opt(s.max_data_loss_window_ms),
            s.split_brain_writes,
        );
    }
    out
}

/// Writes `runs.json`, `report.md` and one SVG timeline per run into `dir` (created if
/// missing), replacing files of the same names. In the SVG names, characters of the scenario
/// other than letters, digits, `-` and `_` become `_`, so scenario names must stay distinct
/// after that.
pub fn write_reports(dir: &Path, runs: &[Run]) -> std::io::Result<Reports> {
    std::fs::create_dir_all(dir)?;
    let summary = summarize(runs);

    #[derive(Serialize)]
    struct RunsFile<'a> {
        summary: &'a [ScenarioSummary],
        runs: &'a [Run],
    }
    let json = dir.join("runs.json");
    let mut text = serde_json::to_string_pretty(&RunsFile {
        summary: &summary,
        runs,
    })?;
    text.push('\n');
    std::fs::write(&json, text)?;

    let markdown = dir.join("report.md");
    std::fs::write(&markdown, markdown_report(&summary, runs))?;

    let mut svgs = Vec::with_capacity(runs.len());
    for run in runs {
        let path = dir.join(format!(
            "timeline-{}-{}.svg",
            file_name_part(&run.scenario),
            run.run
        ));
        std::fs::write(&path, timeline_svg(run))?;
        svgs.push(path);
    }
    Ok(Reports {
        json,
        markdown,
        svgs,
    })
}

/// The whole `report.md`: the summary, the failures of the failed runs, one row per run.
fn markdown_report(summary: &[ScenarioSummary], runs: &[Run]) -> String {
    let mut out = String::from("# ring-chaos report\n\n## Summary\n\n");
    out.push_str(&markdown_summary(summary));

    out.push_str("\n## Failures\n\n");
    let failed: Vec<&Run> = runs.iter().filter(|r| !r.passed()).collect();
    if failed.is_empty() {
        out.push_str("None: every run passed.\n\n");
    }
    for run in failed {
        let _ = writeln!(out, "### {} run {}\n", one_line(&run.scenario), run.run);
        for failure in &run.failures {
            let _ = writeln!(out, "- {}", one_line(failure));
        }
        out.push('\n');
    }

    out.push_str(
        "## Runs\n\n\
         | scenario | run | passed | RTO ms | lost writes | lost older than a delta period \
         | split-brain writes | loss window ms |\n\
         |---|---:|---|---:|---:|---:|---:|---:|\n",
    );
    for run in runs {
        let m = &run.measures;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            md_cell(&run.scenario),
            run.run,
            if run.passed() { "yes" } else { "no" },
            opt(m.rto_ms),
            m.lost_writes,
            m.lost_before_delta_period,
            m.split_brain_writes,
            opt(m.data_loss_window_ms),
        );
    }
    let lossy: Vec<&Run> = runs
        .iter()
        .filter(|r| !r.measures.loss_phases.is_empty())
        .collect();
    if !lossy.is_empty() {
        out.push_str(
            "\n## Lossy links\n\n\
             | scenario | run | phase | s | leader changes | judged | moved | longest wait ms |\n\
             |---|---:|---|---:|---:|---|---|---:|\n",
        );
        for run in lossy {
            for p in &run.measures.loss_phases {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {:.1} | {} | {} | {} | {} |",
                    md_cell(&run.scenario),
                    run.run,
                    md_cell(&p.what),
                    p.end_ms.saturating_sub(p.start_ms) as f64 / 1000.0,
                    p.leader_changes,
                    md_cell(&p.judged.join(", ")),
                    md_cell(&p.moved.join(", ")),
                    p.longest_gap_ms,
                );
            }
        }
    }
    out
}

/// At most this many events are drawn per timeline (the first ones): beyond that the SVG would
/// be unreadable anyway, and its size stays bounded. The title says when some were left out.
const MAX_EVENTS_DRAWN: usize = 1000;
/// Labels longer than this many characters are cut, with "…".
const MAX_LABEL_CHARS: usize = 40;
/// The lanes, top to bottom, and their colours. Events of any other kind go to an `other`
/// lane, drawn only when there are some.
const LANES: [(&str, &str); 6] = [
    ("fault", "#d62728"),
    ("heal", "#2ca02c"),
    ("ring", "#1f77b4"),
    ("dns", "#9467bd"),
    ("client", "#ff7f0e"),
    ("check", "#555555"),
];
const OTHER_LANE: (&str, &str) = ("other", "#8c564b");
/// Rows for the labels, as offsets from their lane's centre line in px, alternately above and
/// below the markers: a label takes the first row where it does not run into that row's
/// previous label.
const LABEL_ROWS: [i32; 4] = [-9, 19, -22, 32];
const WIDTH: u32 = 1200;
const LEFT: u32 = 70;
const RIGHT: u32 = 30;
const TOP: u32 = 70;
const LANE_HEIGHT: u32 = 72;
/// Rough width of one label character at font size 11, px.
const CHAR_WIDTH: f64 = 6.2;

/// The SVG timeline of one run.
fn timeline_svg(run: &Run) -> String {
    let drawn = &run.events[..run.events.len().min(MAX_EVENTS_DRAWN)];
    let lane_of = |e: &Event| LANES.iter().position(|(kind, _)| *kind == e.kind);
    let mut lanes: Vec<(&str, &str)> = LANES.to_vec();
    if drawn.iter().any(|e| lane_of(e).is_none()) {
        lanes.push(OTHER_LANE);
    }
    let first_fault = drawn.iter().find(|e| e.kind == "fault").map(|e| e.at_ms);
    let rto_end = first_fault.zip(run.measures.rto_ms).map(|(f, r)| f + r);

    // The time axis spans the run, and whatever was recorded past its end.
    let end_ms = drawn
        .iter()
        .map(|e| e.at_ms)
        .chain(rto_end)
        .fold(run.duration_ms, u64::max)
        .max(1);
    let plot_width = f64::from(WIDTH - LEFT - RIGHT);
    let x = |ms: u64| f64::from(LEFT) + ms as f64 / end_ms as f64 * plot_width;
    let lanes_bottom = TOP + LANE_HEIGHT * lanes.len() as u32;
    let height = lanes_bottom + 44;

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        svg,
        r#"<rect width="{WIDTH}" height="{height}" fill="white"/>"#
    );

    // Title: scenario, run, verdict, and the headline numbers.
    let (verdict, colour) = if run.passed() {
        ("PASS", "#2ca02c")
    } else {
        ("FAIL", "#d62728")
    };
    let mut numbers = format!(
        "RTO {} · lost {} · split brain {}",
        run.measures
            .rto_ms
            .map_or_else(|| "-".to_string(), |ms| format!("{ms} ms")),
        run.measures.lost_writes,
        run.measures.split_brain_writes
    );
    if drawn.len() < run.events.len() {
        let _ = write!(
            numbers,
            " · first {} of {} events drawn",
            drawn.len(),
            run.events.len()
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="24" font-size="15" font-weight="bold">{} · run {} · <tspan fill="{colour}">{verdict}</tspan></text>"#,
        xml_escape(&run.scenario),
        run.run
    );
    let _ = writeln!(
        svg,
        r##"<text x="{LEFT}" y="42" fill="#444">{}</text>"##,
        xml_escape(&numbers)
    );

    // The RTO band, from the first fault to the first write acknowledged by the new host.
    if let (Some(start), Some(end), Some(rto)) = (first_fault, rto_end, run.measures.rto_ms) {
        let (x1, x2) = (x(start), x(end));
        let _ = writeln!(
            svg,
            r##"<rect x="{x1:.1}" y="{TOP}" width="{:.1}" height="{}" fill="#ffd700" fill-opacity="0.25"/>"##,
            (x2 - x1).max(1.0),
            lanes_bottom - TOP
        );
        let _ = writeln!(
            svg,
            r##"<line x1="{x2:.1}" y1="{TOP}" x2="{x2:.1}" y2="{lanes_bottom}" stroke="#b8860b" stroke-dasharray="4 3"/>"##
        );
        let _ = writeln!(
            svg,
            r##"<text x="{x2:.1}" y="{}" text-anchor="middle" fill="#8b6508" font-weight="bold">RTO {rto} ms</text>"##,
            TOP - 5
        );
    }

    // Lanes: a name on the left and a centre line.
    for (i, (kind, colour)) in lanes.iter().enumerate() {
        let y = lane_centre(i);
        if i % 2 == 1 {
            let _ = writeln!(
                svg,
                r##"<rect x="0" y="{}" width="{WIDTH}" height="{LANE_HEIGHT}" fill="#000" fill-opacity="0.03"/>"##,
                y - LANE_HEIGHT / 2
            );
        }
        let _ = writeln!(
            svg,
            r#"<text x="8" y="{}" fill="{colour}" font-weight="bold">{kind}</text>"#,
            y + 4
        );
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{y}" x2="{}" y2="{y}" stroke="#ccc"/>"##,
            WIDTH - RIGHT
        );
    }

    // Time axis, in seconds.
    let step = tick_step_ms(end_ms);
    let _ = writeln!(
        svg,
        r##"<line x1="{LEFT}" y1="{lanes_bottom}" x2="{}" y2="{lanes_bottom}" stroke="#333"/>"##,
        WIDTH - RIGHT
    );
    for tick in (0..=end_ms).step_by(step as usize) {
        let tx = x(tick);
        let _ = writeln!(
            svg,
            r##"<line x1="{tx:.1}" y1="{TOP}" x2="{tx:.1}" y2="{}" stroke="#eee"/><line x1="{tx:.1}" y1="{lanes_bottom}" x2="{tx:.1}" y2="{}" stroke="#333"/><text x="{tx:.1}" y="{}" text-anchor="middle">{}</text>"##,
            lanes_bottom,
            lanes_bottom + 5,
            lanes_bottom + 18,
            seconds(tick)
        );
    }
    let _ = writeln!(
        svg,
        r##"<text x="{}" y="{}" text-anchor="end" fill="#444">time since start (s)</text>"##,
        WIDTH - RIGHT,
        lanes_bottom + 36
    );

    // Events, in time order. A label takes the first of its lane's rows where it does not run
    // into the row's previous label; when every row is taken it is left out (the marker's
    // tooltip still has the whole text).
    let mut order: Vec<&Event> = drawn.iter().collect();
    order.sort_by_key(|e| e.at_ms);
    let mut row_ends = vec![[f64::NEG_INFINITY; LABEL_ROWS.len()]; lanes.len()];
    for event in order {
        let lane = lane_of(event).unwrap_or(lanes.len() - 1);
        let (cx, cy) = (x(event.at_ms), lane_centre(lane));
        let _ = writeln!(
            svg,
            r#"<circle cx="{cx:.1}" cy="{cy}" r="5" fill="{}" fill-opacity="0.85"><title>{} {}</title></circle>"#,
            lanes[lane].1,
            seconds(event.at_ms),
            xml_escape(&truncate(&label_of(event), 500)),
        );

        let label = truncate(&label_of(event), MAX_LABEL_CHARS);
        let label_width = label.chars().count() as f64 * CHAR_WIDTH;
        // Right of the marker, or left of it when the label would leave the picture.
        let (label_x, anchor, left) = if cx + 2.0 + label_width <= f64::from(WIDTH) - 4.0 {
            (cx + 2.0, "start", cx + 2.0)
        } else {
            (cx - 2.0, "end", cx - 2.0 - label_width)
        };
        let ends = &mut row_ends[lane];
        if let Some(row) = (0..LABEL_ROWS.len()).find(|&r| ends[r] < left) {
            ends[row] = left + label_width + 6.0;
            let _ = writeln!(
                svg,
                r##"<text x="{label_x:.1}" y="{}" text-anchor="{anchor}" fill="#222">{}</text>"##,
                cy as i32 + LABEL_ROWS[row],
                xml_escape(&label)
            );
        }
    }

    svg.push_str("</svg>\n");
    svg
}

/// The y of the centre line of lane `i`.
fn lane_centre(i: usize) -> u32 {
    TOP + LANE_HEIGHT * i as u32 + LANE_HEIGHT / 2
}

/// A tick spacing giving at most about ten ticks over `end_ms`.
fn tick_step_ms(end_ms: u64) -> u64 {
    const NICE: [u64; 13] = [
        100, 200, 500, 1_000, 2_000, 5_000, 10_000, 15_000, 30_000, 60_000, 120_000, 300_000,
        600_000,
    ];
    NICE.into_iter()
        .find(|step| end_ms / step <= 10)
        .unwrap_or_else(|| end_ms.div_ceil(10))
}

/// `ms` as seconds: `12s`, or `1.5s` when not whole.
fn seconds(ms: u64) -> String {
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{:.1}s", ms as f64 / 1000.0)
    }
}

/// What an event's marker says: its subject and detail.
fn label_of(event: &Event) -> String {
    if event.subject.is_empty() {
        event.detail.clone()
    } else {
        format!("{}: {}", event.subject, event.detail)
    }
}

/// `text` cut to `max` characters, the last one "…" when cut.
fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut cut: String = text.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// `text` safe inside SVG text and attributes.
fn xml_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// A Markdown table cell: on one line, with `|` escaped.
fn md_cell(text: &str) -> String {
    one_line(text).replace('|', "\\|")
}

/// `text` with its line breaks as spaces.
fn one_line(text: &str) -> String {
    text.replace(['\r', '\n'], " ")
}

/// A number, or "-" when there is none.
fn opt(value: Option<u64>) -> String {
    value.map_or_else(|| "-".to_string(), |v| v.to_string())
}

/// A scenario name as part of a file name: anything but letters, digits, `-` and `_` becomes
/// `_`.
fn file_name_part(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ClientStats, LossPhase, Measures};

    fn event(at_ms: u64, kind: &str, subject: &str, detail: &str) -> Event {
        Event {
            at_ms,
            kind: kind.to_string(),
            subject: subject.to_string(),
            detail: detail.to_string(),
        }
    }

    fn run(scenario: &str, n: u32, measures: Measures, failures: &[&str]) -> Run {
        Run {
            scenario: scenario.to_string(),
            run: n,
            started_unix_ms: 1_700_000_000_000,
            duration_ms: 30_000,
            measures,
            clients: vec![ClientStats {
                control_plane: "cp-a".to_string(),
                attempted: 100,
                acknowledged: 98,
                ..ClientStats::default()
            }],
            events: vec![
                event(2_000, "fault", "zone-b", "zone b cut off"),
                event(7_500, "ring", "zone-b", "member judged lost"),
                event(8_000, "ring", "", "leader elected"),
                event(
                    9_000,
                    "dns",
                    "cp-a",
                    "cp-a.example -> 10.0.0.3 <&> 'x' \"y\"",
                ),
                event(12_000, "client", "cp-a", "first write acknowledged"),
                event(20_000, "heal", "zone-b", "zone b back"),
                event(29_000, "check", "", "no split brain"),
            ],
            failures: failures.iter().map(|f| f.to_string()).collect(),
        }
    }

    fn sample_runs() -> Vec<Run> {
        vec![
            run(
                "zone-loss",
                1,
                Measures {
                    detect_ms: Some(5_500),
                    elect_ms: Some(6_000),
                    rto_ms: Some(10_000),
                    lost_writes: 0,
                    lost_before_delta_period: 0,
                    data_loss_window_ms: Some(1_200),
                    split_brain_writes: 0,
                    etcd_repair_ms: None,
                    loss_phases: vec![LossPhase {
                        what: "30% loss".into(),
                        start_ms: 1_000,
                        end_ms: 61_000,
                        judged: vec!["c suspect".into()],
                        longest_gap_ms: 420,
                        ..LossPhase::default()
                    }],
                    registry: None,
                    etcd_restarts: None,
                },
                &[],
            ),
            run(
                "partition",
                1,
                Measures {
                    detect_ms: Some(4_000),
                    ..Measures::default()
                },
                &[],
            ),
            run(
                "zone-loss",
                2,
                Measures {
                    detect_ms: Some(6_500),
                    elect_ms: None,
                    rto_ms: Some(14_000),
                    lost_writes: 3,
                    lost_before_delta_period: 2,
                    data_loss_window_ms: Some(2_500),
                    split_brain_writes: 1,
                    etcd_repair_ms: None,
                    loss_phases: Vec::new(),
                    registry: None,
                    etcd_restarts: None,
                },
                &["split brain: 1 write acknowledged by the old host"],
            ),
        ]
    }

    #[test]
    fn percentile_edge_cases() {
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[], 99.0), None);
        assert_eq!(percentile(&[7], 0.0), Some(7));
        assert_eq!(percentile(&[7], 50.0), Some(7));
        assert_eq!(percentile(&[7], 99.0), Some(7));
        assert_eq!(percentile(&[3, 9], 50.0), Some(3));
        assert_eq!(percentile(&[3, 9], 99.0), Some(9));
        assert_eq!(percentile(&[1, 2, 3], 50.0), Some(2));
        assert_eq!(percentile(&[1, 2, 3, 4], 50.0), Some(2));
        assert_eq!(percentile(&[1, 2, 3, 4], 100.0), Some(4));
        // Fewer than 100 values: p99 is the largest.
        let ninety_nine: Vec<u64> = (1..=99).collect();
        assert_eq!(percentile(&ninety_nine, 99.0), Some(99));
        // Exactly 100: p99 is the 99th value, not the largest.
        let hundred: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&hundred, 99.0), Some(99));
        assert_eq!(percentile(&hundred, 50.0), Some(50));
    }

    #[test]
    fn summarize_groups_by_scenario_in_first_seen_order() {
        let summaries = summarize(&sample_runs());
        assert_eq!(summaries.len(), 2);

        let zone = &summaries[0];
        assert_eq!(zone.scenario, "zone-loss");
        assert_eq!((zone.runs, zone.passed), (2, 1));
        assert_eq!(zone.rto_p50_ms, Some(10_000));
        assert_eq!(zone.rto_p99_ms, Some(14_000));
        assert_eq!(zone.rto_max_ms, Some(14_000));
        assert_eq!(zone.detect_p50_ms, Some(5_500));
        assert_eq!(zone.elect_p50_ms, Some(6_000), "only the runs that elected");
        assert_eq!(zone.lost_writes, 3);
        assert_eq!(zone.lost_before_delta_period, 2);
        assert_eq!(zone.max_data_loss_window_ms, Some(2_500));
        assert_eq!(zone.split_brain_writes, 1);

        let partition = &summaries[1];
        assert_eq!(partition.scenario, "partition");
        assert_eq!((partition.runs, partition.passed), (1, 1));
        assert_eq!(partition.rto_p50_ms, None);
        assert_eq!(partition.elect_p50_ms, None);
        assert_eq!(partition.max_data_loss_window_ms, None);

        let table = markdown_summary(&summaries);
        assert!(table.contains(
            "| zone-loss | 2 | 1 | 10000 | 14000 | 14000 | 5500 | 6000 | 3 | 2 | 2500 | 1 |"
        ));
        assert!(table.contains("| partition | 1 | 1 | - | - | - | 4000 | - | 0 | 0 | - | 0 |"));
    }

    #[test]
    fn write_reports_writes_json_markdown_and_timelines() {
        let dir = std::env::temp_dir().join(format!(
            "ring-chaos-report-test-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        let runs = sample_runs();
        let reports = write_reports(&dir, &runs).expect("reports written");

        assert!(reports.json.is_file());
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&reports.json).unwrap()).unwrap();
        assert_eq!(json["summary"].as_array().map(Vec::len), Some(2));
        assert_eq!(json["runs"].as_array().map(Vec::len), Some(3));
        let back: Vec<Run> = serde_json::from_value(json["runs"].clone()).unwrap();
        assert_eq!(back, runs);

        assert!(reports.markdown.is_file());
        let md = std::fs::read_to_string(&reports.markdown).unwrap();
        assert!(md.contains("| zone-loss | 2 | 1 | 10000 |"));
        assert!(md.contains("### zone-loss run 2"));
        assert!(md.contains("- split brain: 1 write acknowledged by the old host"));
        assert!(md.contains("| zone-loss | 2 | no | 14000 | 3 | 2 | 1 | 2500 |"));
        assert!(md.contains("| zone-loss | 1 | 30% loss | 60.0 | 0 | c suspect |  | 420 |"));

        assert_eq!(reports.svgs.len(), 3);
        assert_eq!(
            reports.svgs[0].file_name().and_then(|n| n.to_str()),
            Some("timeline-zone-loss-1.svg")
        );
        for path in &reports.svgs {
            assert!(path.is_file());
        }
        let svg = std::fs::read_to_string(&reports.svgs[0]).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("RTO 10000 ms"));
        assert!(svg.contains("PASS"));
        assert!(svg.contains("&lt;&amp;&gt;"));
        assert!(!svg.contains("<&>"));
        let failed = std::fs::read_to_string(&reports.svgs[2]).unwrap();
        assert!(failed.contains("FAIL"));
        let no_rto = std::fs::read_to_string(&reports.svgs[1]).unwrap();
        assert!(!no_rto.contains("RTO 1"), "no band without an RTO");

        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn timeline_bounds_events_and_labels() {
        let mut many = run("flood", 1, Measures::default(), &[]);
        many.events = (0..1500)
            .map(|i| event(i * 10, "odd", "", &"x".repeat(100)))
            .collect();
        let svg = timeline_svg(&many);
        assert_eq!(svg.matches("<circle").count(), MAX_EVENTS_DRAWN);
        assert!(svg.contains("first 1000 of 1500 events drawn"));
        assert!(svg.contains(">other</text>"));
        // Labels that would overlap are left out rather than piled up.
        assert!(svg.matches("fill=\"#222\"").count() < 10);
        assert!(svg.contains(&format!(">{}…</text>", "x".repeat(MAX_LABEL_CHARS - 1))));
    }
}
