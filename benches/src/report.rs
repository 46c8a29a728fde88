//! What both benchmark binaries print and write: comparison rows, the Markdown table, the
//! machine's description and the JSON file.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

/// One line of the comparison: a figure for Lineage and each contender measured in the same run.
#[derive(Clone, Debug)]
pub struct Row {
    /// What is measured.
    pub figure: String,
    /// Its unit.
    pub unit: &'static str,
    /// Lineage's value.
    pub lineage: f64,
    /// Each contender's value.
    pub others: Vec<(&'static str, f64)>,
    /// The target, as text, and whether Lineage meets it.
    pub target: Option<(String, bool)>,
    /// Whether a larger value is better (throughput) or a smaller one (time, bytes).
    pub higher_is_better: bool,
}

impl Row {
    /// A row of times in milliseconds, smaller being better.
    pub fn time(figure: String, lineage: Duration, others: Vec<(&'static str, Duration)>) -> Row {
        Row {
            figure,
            unit: "ms",
            lineage: lineage.as_secs_f64() * 1e3,
            others: others
                .into_iter()
                .map(|(n, d)| (n, d.as_secs_f64() * 1e3))
                .collect(),
            target: None,
            higher_is_better: false,
        }
    }

    /// How many times better Lineage is than `other` (above 1: Lineage wins).
    pub fn advantage(&self, other: f64) -> f64 {
        if self.higher_is_better {
            self.lineage / other
        } else {
            other / self.lineage
        }
    }

    /// The row as JSON.
    pub fn json(&self) -> Value {
        json!({
            "figure": self.figure,
            "unit": self.unit,
            "lineage": self.lineage,
            "higher_is_better": self.higher_is_better,
            "contenders": self.others.iter().map(|(name, v)| json!({
                "name": name, "value": v, "lineage_advantage": self.advantage(*v),
            })).collect::<Vec<_>>(),
            "target": self.target.as_ref().map(|(t, ok)| json!({"text": t, "met": ok})),
        })
    }
}

fn fmt_value(v: f64) -> String {
    if v >= 100_000.0 {
        format!("{:.0}k", v / 1e3)
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// The comparison as a Markdown table; `subject` heads Lineage's column (`Lineage`,
/// `HttpModel`).
pub fn table(rows: &[Row], subject: &str) -> String {
    let mut out = format!(
        "| figure | unit | {subject} | contenders (value, {subject}'s advantage) | target |\n\
         |---|---|---|---|---|\n"
    );
    for row in rows {
        let others = row
            .others
            .iter()
            .map(|(name, v)| format!("{name}: {} ({:.2}×)", fmt_value(*v), row.advantage(*v)))
            .collect::<Vec<_>>()
            .join("; ");
        let target = match &row.target {
            Some((text, true)) => format!("{text}: met"),
            Some((text, false)) => format!("{text}: **missed**"),
            None => String::new(),
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            row.figure,
            row.unit,
            fmt_value(row.lineage),
            others,
            target
        ));
    }
    out
}

/// The machine the figures come from: its CPU model and core count.
pub fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_default();
    json!({
        "cpu": cpu,
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
    })
}

/// Writes `json` to `path` (its directory created), saying on stderr where or why not.
pub fn write_json(path: &Path, json: &Value) {
    if let Some(parent) = path.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    let text =
        serde_json::to_string_pretty(json).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
    match std::fs::write(path, text) {
        Ok(()) => eprintln!("wrote {}", path.display()),
        Err(e) => eprintln!("could not write {}: {e}", path.display()),
    }
}
