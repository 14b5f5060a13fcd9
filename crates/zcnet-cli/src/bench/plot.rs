//! SVG plots (plotters, SVG backend only): throughput and CPU-seconds per GiB against size,
//! one line per path — the shape of the CMU paper's figure 5 — and the suite's other
//! experiments against their own parameter.

use super::spec::BenchError;
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;
use zcnet_bench::report::SummaryRow;
use zcnet_bench::sizes::ByteSize;

/// One line.
#[derive(Debug, Clone)]
pub(crate) struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// One chart of a figure.
#[derive(Debug, Clone)]
pub(crate) struct Panel {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// Logarithmic x axis (sizes, ring depths).
    pub log_x: bool,
    /// x values are byte sizes (labelled 4K, 1M).
    pub x_is_size: bool,
    pub series: Vec<Series>,
}

fn perr<E: std::fmt::Display>(path: &Path) -> impl Fn(E) -> BenchError + '_ {
    move |e| BenchError::Failed(format!("drawing {}: {e}", path.display()))
}

fn fmt_x(x: f64, is_size: bool) -> String {
    if is_size {
        ByteSize(x.round().max(1.0) as u64).to_string()
    } else if x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

/// Draws `panels` side by side into the SVG file `path`.
pub(crate) fn figure(path: &Path, title: &str, panels: &[Panel]) -> Result<(), BenchError> {
    let width = 560 * panels.len().max(1) as u32;
    let root = SVGBackend::new(path, (width, 440)).into_drawing_area();
    root.fill(&WHITE).map_err(perr(path))?;
    let root = root.titled(title, ("sans-serif", 18)).map_err(perr(path))?;
    let areas = root.split_evenly((1, panels.len().max(1)));
    for (area, panel) in areas.iter().zip(panels) {
        let pts = panel.series.iter().flat_map(|s| s.points.iter());
        let (mut xmin, mut xmax, mut ymax) = (f64::INFINITY, f64::NEG_INFINITY, 0f64);
        let mut ymin_pos = f64::INFINITY;
        for &(x, y) in pts {
            xmin = xmin.min(x);
            xmax = xmax.max(x);
            ymax = ymax.max(y);
            if y > 0.0 {
                ymin_pos = ymin_pos.min(y);
            }
        }
        // Values over more than two decades (CPU per GiB from 1-byte messages to 1 MiB, round
        // trips from µs to ms) would flatten all but the largest on a linear axis.
        let log_y = ymin_pos.is_finite() && ymax / ymin_pos > 100.0;
        if !xmin.is_finite() {
            continue;
        }
        if xmax <= xmin {
            xmax = xmin * 2.0 + 1.0;
        }
        let ymax = if ymax > 0.0 { ymax * 1.15 } else { 1.0 };
        let mut b = ChartBuilder::on(area);
        b.caption(&panel.title, ("sans-serif", 15))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60);
        let is_size = panel.x_is_size;
        let y_desc = if log_y {
            format!("{} (log)", panel.y_label)
        } else {
            panel.y_label.clone()
        };
        let series: Vec<Series> = panel
            .series
            .iter()
            .map(|s| Series {
                name: s.name.clone(),
                points: s
                    .points
                    .iter()
                    .copied()
                    .filter(|&(_, y)| !log_y || y > 0.0)
                    .collect(),
            })
            .collect();
        macro_rules! draw {
            ($chart:expr) => {{
                let mut chart = $chart;
                chart
                    .configure_mesh()
                    .x_desc(panel.x_label.as_str())
                    .y_desc(y_desc.as_str())
                    .x_label_formatter(&|x| fmt_x(*x, is_size))
                    .draw()
                    .map_err(perr(path))?;
                for (i, s) in series.iter().enumerate() {
                    let color = Palette99::pick(i).to_rgba();
                    chart
                        .draw_series(LineSeries::new(s.points.clone(), color.stroke_width(2)))
                        .map_err(perr(path))?
                        .label(s.name.as_str())
                        .legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                        });
                }
                chart
                    .configure_series_labels()
                    .position(SeriesLabelPosition::UpperRight)
                    .background_style(WHITE.mix(0.85))
                    .border_style(BLACK)
                    .draw()
                    .map_err(perr(path))?;
            }};
        }
        let ylow = ymin_pos / 1.5;
        match (panel.log_x, log_y) {
            (true, true) => draw!(b
                .build_cartesian_2d((xmin..xmax).log_scale(), (ylow..ymax).log_scale())
                .map_err(perr(path))?),
            (true, false) => draw!(b
                .build_cartesian_2d((xmin..xmax).log_scale(), 0f64..ymax)
                .map_err(perr(path))?),
            (false, true) => draw!(b
                .build_cartesian_2d(xmin..xmax, (ylow..ymax).log_scale())
                .map_err(perr(path))?),
            (false, false) => draw!(b
                .build_cartesian_2d(xmin..xmax, 0f64..ymax)
                .map_err(perr(path))?),
        }
    }
    root.present().map_err(perr(path))?;
    Ok(())
}

/// Series of `rows` against size, one per configuration other than size, for the measure
/// `f`.
pub(crate) fn by_size(rows: &[&SummaryRow], f: fn(&SummaryRow) -> f64) -> Vec<Series> {
    let mut m: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let mut order = Vec::new();
    for r in rows {
        let mut name = format!("{}→{}", r.tx, r.rx);
        if r.topology != "loopback" {
            name += &format!(" ({})", r.topology);
        }
        if r.touch {
            name += " touch";
        }
        if r.streams > 1 {
            name += &format!(" ×{}", r.streams);
        }
        if !m.contains_key(&name) {
            order.push(name.clone());
        }
        m.entry(name).or_default().push((r.size as f64, f(r)));
    }
    order
        .into_iter()
        .filter_map(|name| {
            let mut points = m.remove(&name)?;
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            Some(Series { name, points })
        })
        .collect()
}

/// `--plot`: throughput and CPU-s/GiB against size, one line per path.
pub(crate) fn sweep(path: &Path, rows: &[SummaryRow], title: &str) -> Result<(), BenchError> {
    let rows: Vec<&SummaryRow> = rows.iter().collect();
    let sizes: std::collections::BTreeSet<u64> = rows.iter().map(|r| r.size).collect();
    if sizes.len() < 2 {
        return Err(BenchError::Usage(
            "--plot draws against size: give a sweep such as --size 4K..1M".into(),
        ));
    }
    let rr = rows.iter().all(|r| r.mode == zcnet_bench::report::Mode::Rr);
    let first = if rr {
        Panel {
            title: "round-trip time (p50)".into(),
            x_label: "message size".into(),
            y_label: "µs".into(),
            log_x: true,
            x_is_size: true,
            series: by_size(&rows, |r| r.rtt_p50_us.map_or(0.0, |s| s.median)),
        }
    } else {
        Panel {
            title: "throughput".into(),
            x_label: "bytes per send".into(),
            y_label: "Gbit/s".into(),
            log_x: true,
            x_is_size: true,
            series: by_size(&rows, |r| r.gbit_per_s.median),
        }
    };
    let second = Panel {
        title: "CPU per GiB (whole machine)".into(),
        x_label: if rr { "message size" } else { "bytes per send" }.into(),
        y_label: "CPU-s/GiB".into(),
        log_x: true,
        x_is_size: true,
        series: by_size(&rows, |r| r.cpu_s_per_gib.median),
    };
    figure(path, title, &[first, second])
}
