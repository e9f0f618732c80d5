//! SVG plots of a comparison: latency percentile curves per target, and throughput and p99
//! over time (with config pushes marked). Plain SVG text, a few KB each, no fonts needed.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::report::{CompareResult, Marker};
use crate::stats::TimePoint;
use crate::Error;

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

fn plot_err(e: impl std::fmt::Display) -> Error {
    Error::Run(format!("plot: {e}"))
}

/// One target's percentile curve: `(percentile, µs)` points.
pub type Curve = (String, Vec<(f64, u64)>);

/// Writes the latency percentile curves: x is the percentile on the usual "nines" scale
/// (90%, 99%, 99.9%, ...), y the latency in ms on a log scale.
pub fn percentiles_svg(path: &Path, title: &str, curves: &[Curve]) -> Result<(), Error> {
    // x = -log10(1 - p): 0 = 0%, 1 = 90%, 2 = 99%, ...; the max (p = 100) is left out.
    let nines = |p: f64| -(1.0 - p / 100.0).max(1e-9).log10();
    let pts: Vec<(String, Vec<(f64, f64)>)> = curves
        .iter()
        .map(|(n, c)| {
            (
                n.clone(),
                c.iter()
                    .filter(|(p, _)| *p < 100.0)
                    .map(|&(p, us)| (nines(p), (us.max(1) as f64) / 1000.0))
                    .collect(),
            )
        })
        .collect();
    let ymax = pts
        .iter()
        .flat_map(|(_, c)| c.iter().map(|p| p.1))
        .fold(0.01f64, f64::max)
        * 1.5;
    let ymin = pts
        .iter()
        .flat_map(|(_, c)| c.iter().map(|p| p.1))
        .fold(f64::INFINITY, f64::min)
        .min(ymax / 10.0)
        .max(0.001)
        / 1.5;
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .margin_right(36)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..5f64, (ymin..ymax).log_scale())
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_labels(6)
        .x_label_formatter(&|x| {
            let labels = ["0%", "90%", "99%", "99.9%", "99.99%", "99.999%"];
            let i = x.round() as usize;
            if (x - x.round()).abs() < 1e-6 && i < labels.len() {
                labels[i].to_string()
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|y| format!("{y}"))
        .x_desc("percentile")
        .y_desc("latency (ms)")
        .draw()
        .map_err(plot_err)?;
    for (i, (name, c)) in pts.iter().enumerate() {
        let col = color(i);
        chart
            .draw_series(LineSeries::new(c.iter().copied(), col.stroke_width(2)))
            .map_err(plot_err)?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], col.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(plot_err)?;
    root.present().map_err(plot_err)?;
    Ok(())
}

/// One target's timeline.
pub type Timeline = (String, Vec<TimePoint>);

/// Writes throughput (top) and p99 latency (bottom) over time, one line per target, with a
/// dashed vertical line and label at each marker.
pub fn timeline_svg(
    path: &Path,
    title: &str,
    series: &[Timeline],
    markers: &[Marker],
) -> Result<(), Error> {
    let tmax = series
        .iter()
        .flat_map(|(_, s)| s.iter().map(|p| p.t_s))
        .fold(1.0f64, f64::max);
    let rmax = series
        .iter()
        .flat_map(|(_, s)| s.iter().map(|p| p.rps))
        .fold(1.0f64, f64::max)
        * 1.15;
    let pmax = series
        .iter()
        .flat_map(|(_, s)| s.iter().filter_map(|p| p.p99_us))
        .fold(1u64, u64::max) as f64
        / 1000.0
        * 1.15;
    let root = SVGBackend::new(path, (900, 620)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let root = root.titled(title, ("sans-serif", 20)).map_err(plot_err)?;
    let (top, bottom) = root.split_vertically(300);
    let mut up = ChartBuilder::on(&top)
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..tmax, 0f64..rmax)
        .map_err(plot_err)?;
    up.configure_mesh()
        .y_desc("requests/s")
        .y_label_formatter(&|y| format!("{:.0}k", y / 1000.0))
        .draw()
        .map_err(plot_err)?;
    let mut down = ChartBuilder::on(&bottom)
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..tmax, 0f64..pmax)
        .map_err(plot_err)?;
    down.configure_mesh()
        .x_desc("seconds under load (rounds back to back)")
        .y_desc("p99 (ms)")
        .draw()
        .map_err(plot_err)?;
    for (i, (name, s)) in series.iter().enumerate() {
        let col = color(i);
        up.draw_series(LineSeries::new(
            s.iter().map(|p| (p.t_s, p.rps)),
            col.stroke_width(2),
        ))
        .map_err(plot_err)?
        .label(name.clone())
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], col.stroke_width(2)));
        down.draw_series(LineSeries::new(
            s.iter()
                .filter_map(|p| Some((p.t_s, p.p99_us? as f64 / 1000.0))),
            col.stroke_width(2),
        ))
        .map_err(plot_err)?;
    }
    for m in markers {
        let style = BLACK.mix(0.6).stroke_width(1);
        for (chart_top, ymax) in [(true, rmax), (false, pmax)] {
            let line = DashedLineSeries::new(vec![(m.t_s, 0.0), (m.t_s, ymax)], 6, 4, style);
            if chart_top {
                up.draw_series(line).map_err(plot_err)?;
                up.draw_series(std::iter::once(Text::new(
                    m.label.clone(),
                    (m.t_s, ymax * 0.97),
                    ("sans-serif", 12),
                )))
                .map_err(plot_err)?;
            } else {
                down.draw_series(line).map_err(plot_err)?;
            }
        }
    }
    up.configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(plot_err)?;
    root.present().map_err(plot_err)?;
    Ok(())
}

/// Writes `latency.svg` and `timeline.svg` for a comparison into `dir`; returns their paths.
pub fn compare_plots(dir: &Path, r: &CompareResult) -> Result<Vec<PathBuf>, Error> {
    std::fs::create_dir_all(dir)?;
    let lat = dir.join("latency.svg");
    let curves: Vec<Curve> = r
        .targets
        .iter()
        .map(|t| (t.name.clone(), t.summary.percentiles.clone()))
        .collect();
    percentiles_svg(
        &lat,
        &format!("{}: latency by percentile", r.scenario),
        &curves,
    )?;
    let tl = dir.join("timeline.svg");
    let series: Vec<Timeline> = r
        .targets
        .iter()
        .map(|t| (t.name.clone(), t.summary.timeline.clone()))
        .collect();
    timeline_svg(
        &tl,
        &format!("{}: throughput and p99 over time", r.scenario),
        &series,
        &r.markers,
    )?;
    Ok(vec![lat, tl])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plots_are_small_svgs() {
        let dir = std::env::temp_dir().join(format!("respway-perf-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let curve: Vec<(f64, u64)> = (0..=50)
            .map(|i| (100.0 * (1.0 - 10f64.powf(-(i as f64) / 10.0)), 50 + i * 20))
            .collect();
        let p = dir.join("l.svg");
        percentiles_svg(&p, "t", &[("a".into(), curve.clone()), ("b".into(), curve)]).unwrap();
        let svg = std::fs::read_to_string(&p).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("99.9%"),
            "{}",
            &svg[..200]
        );
        let tl: Vec<TimePoint> = (1..=20)
            .map(|i| TimePoint {
                t_s: i as f64,
                rps: 1000.0 * i as f64,
                p99_us: Some(100 + i),
                errors: 0,
            })
            .collect();
        let p = dir.join("t.svg");
        timeline_svg(
            &p,
            "t",
            &[("a".into(), tl)],
            &[Marker {
                t_s: 5.0,
                label: "config push v2".into(),
            }],
        )
        .unwrap();
        let svg = std::fs::read_to_string(&p).unwrap();
        assert!(svg.contains("config push v2"));
        assert!(svg.len() < 200_000);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
