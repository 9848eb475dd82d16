use super::step::{decode_size, gemm_size, prefill_size};
use super::*;

/// A calibration whose fits are refits of its samples (as `gpu-bench --calibrate` writes).
pub fn calibration() -> Calibration {
    let class = |scale: f64| {
        let samples = (1..6)
            .map(|i| {
                let (b, f) = (1e6 * 10f64.powi(i), 1e9 * 7f64.powi(i));
                Sample {
                    label: format!("point {i}"),
                    bytes: b,
                    flops: f,
                    ctas: 0.0,
                    us: scale * (3.0 + b * 1e-9 * 300.0 + f * 1e-12 * 1500.0),
                    gemm_mkn: None,
                }
            })
            .collect();
        KernelClass::fitted(samples).unwrap()
    };
    Calibration {
        format: CALIBRATION_FORMAT,
        device: "test device".into(),
        commit: "0000000".into(),
        decode: vec![
            HeadsClass {
                heads: 8,
                class: class(1.0),
            },
            HeadsClass {
                heads: 128,
                class: class(3.0),
            },
        ],
        prefill: vec![HeadsClass {
            heads: 8,
            class: class(1.2),
        }],
        gemm: class(0.9),
        convert: class(0.5),
        overhead: Overhead::fitted(
            [
                (true, 1, 0, 8, 48.0),
                (true, 2, 1, 8, 118.0),
                (true, 2, 3, 8, 218.0),
                (true, 2, 3, 32, 242.0),
                (false, 2, 1, 8, 400.0),
            ]
            .iter()
            .map(|&(graph, layers, passes, tokens, us)| OverheadSample {
                label: format!("{layers} layers, {passes} passes, {tokens} tokens"),
                graph,
                layers,
                passes,
                tokens,
                us,
                steps: 10,
            })
            .collect(),
        ),
        allreduce: AllReduce {
            latency_us: 10.0,
            bus_gb_per_s: 300.0,
            source: "assumed for the test".into(),
        },
    }
}

#[test]
fn calibration_round_trips_and_refuses_edits() {
    let c = calibration();
    assert_eq!(Calibration::from_json(&c.to_json()).unwrap(), c);
    let mut edited = c.clone();
    edited.gemm.fit.us_per_gb *= 0.5;
    let e = Calibration::from_json(&edited.to_json()).unwrap_err();
    assert!(
        e.contains("gemm: the fit does not match its samples"),
        "{e}"
    );
    let mut future = c.clone();
    future.format = 99;
    assert!(Calibration::from_json(&future.to_json())
        .unwrap_err()
        .contains("format 99"));
    let mut edited = c.clone();
    edited.overhead.graph.step_us += 1.0;
    assert!(Calibration::from_json(&edited.to_json())
        .unwrap_err()
        .contains("overhead"));
    let mut negative = c;
    negative.allreduce.bus_gb_per_s = 0.0;
    assert!(Calibration::from_json(&negative.to_json()).is_err());
    assert!(Calibration::from_json("{}")
        .unwrap_err()
        .starts_with("not a calibration file"));
}

#[test]
fn fitted_classes_report_their_errors() {
    let c = calibration();
    let (median, max) = c.decode[0].class.fit_errors();
    assert!(median < 1e-9 && max < 1e-9, "{median} {max}");
}

#[test]
fn sizes_count_what_the_kernels_move_and_compute() {
    assert_eq!(gemm_size(2, 3, 4, 1), ((6.0 + 12.0 + 8.0) * 2.0, 48.0, 1.0));
    // A narrow GEMM is one wave whatever its M: K 7168 is 112 steps of 64.
    assert_eq!(gemm_size(1, 7168, 576, 1).2, 112.0);
    assert_eq!(gemm_size(128, 7168, 576, 1).2, 112.0);
    // 16 x 56 tiles fill 7 waves of 132 CTAs; a batch multiplies the tiles.
    assert_eq!(gemm_size(2048, 2048, 7168, 1).2, 7.0 * 32.0);
    assert_eq!(gemm_size(1, 128, 512, 8).2, 2.0);
    // 1 x 8 heads pads to one 64-row group; 4 x 16 fills it exactly.
    let (_, f1, c1) = decode_size(8, &[(1, 100, 3)]);
    let (_, f4, _) = decode_size(16, &[(4, 100, 1)]);
    assert_eq!(f1, f4);
    assert_eq!(f1, 2.0 * 64.0 * 100.0 * 1088.0);
    // CTAs: row groups times splits (48 x 8 = 384 rows: 6 groups).
    assert_eq!(c1, 3.0);
    assert_eq!(decode_size(8, &[(48, 100, 2), (1, 5, 1)]).2, 13.0);
    // Causal over m new tokens: the lower triangle; with context, every context key.
    let (_, causal, _) = prefill_size(1, &[(4, 4)], true);
    assert_eq!(causal, 2.0 * 10.0 * 320.0);
    let (_, with_ctx, _) = prefill_size(1, &[(4, 10)], true);
    assert_eq!(with_ctx, 2.0 * (10.0 + 24.0) * 320.0);
    let (_, full, _) = prefill_size(2, &[(3, 5)], false);
    assert_eq!(full, 2.0 * 2.0 * 15.0 * 320.0);
    // Work units: waves of (query tiles x heads x rows) CTAs over 132 SMs, times the key
    // tiles of the longest row (half the triangle when causal).
    assert_eq!(prefill_size(8, &[(64, 8192)], false).2, 64.0);
    assert_eq!(prefill_size(8, &[(16, 2048)], false).2, 16.0);
    assert_eq!(prefill_size(8, &[(64, 2048); 64], false).2, 4.0 * 16.0);
    assert_eq!(prefill_size(8, &[(512, 512)], true).2, 2.0);
    assert_eq!(prefill_size(8, &[(48, 48), (16, 4096)], false).2, 32.0);
}

#[test]
fn targets() {
    let t = CostTarget::deepseek_v3(8).unwrap();
    assert_eq!(
        (t.rank_dims.num_heads, t.rank_dims.num_layers, t.tp),
        (16, 61, 8)
    );
    assert!(CostTarget::deepseek_v3(3).is_err());
    let e = CostTarget::engine(&crate::config::ModelDims::tiny());
    assert_eq!((e.tp, e.moe), (1, None));
}

#[test]
fn overhead_fits_per_kind() {
    let c = calibration();
    let g = c.overhead.graph;
    // a + l + 8t = 48, a + 2l + p + 8t = 118, a + 2l + 3p + 8t = 218, + 24 more tokens
    // = 242: t = 1, p = 50, l = 20, a = 20.
    let close = |a: f64, b: f64| (a - b).abs() < 1e-6;
    assert!(
        close(g.token_us, 1.0)
            && close(g.pass_us, 50.0)
            && close(g.layer_us, 20.0)
            && close(g.step_us, 20.0),
        "{g:?}"
    );
    assert!(close(g.us(2, 1, 8), 118.0));
    // One eager sample: some non-negative fit through it.
    assert!(close(c.overhead.eager.us(2, 1, 8), 400.0));
}

#[test]
fn classes_by_the_nearest_head_count() {
    let c = calibration();
    let at = |h| nearest_heads(&c.decode, h).fit.overhead_us;
    assert_eq!(at(8), at(1));
    assert_eq!(at(16), at(8));
    assert_eq!(at(64), at(128));
    assert_eq!(at(32), at(128)); // equal ratios: the larger count
    assert!(at(128) > at(8));
}

/// A timed GEMM shape is priced from its own samples: exact at a timed M, linear between
/// two, the smallest M's time below them, the fit's growth above them; an untimed
/// shape has no table price (the fit prices it).
#[test]
fn gemm_table_interpolates_the_timed_shapes() {
    let timed = [(1, 20.0), (128, 20.0), (512, 60.0), (2048, 200.0)];
    let samples: Vec<Sample> = timed
        .iter()
        .map(|&(m, us)| {
            let (bytes, flops, ctas) = step::gemm_size(m, 7168, 576, 1);
            Sample {
                label: format!("gemm M {m}"),
                bytes,
                flops,
                ctas,
                us,
                gemm_mkn: Some([m, 7168, 576]),
            }
        })
        .collect();
    let class = KernelClass::fitted(samples).unwrap();
    let at = |m| class.gemm_table_us(m, 7168, 576).unwrap();
    assert_eq!(at(128), 20.0);
    assert_eq!(at(64), 20.0);
    assert_eq!(at(320), 40.0);
    assert_eq!(at(1280), 130.0);
    let fit = |m| {
        let (b, f, u) = step::gemm_size(m, 7168, 576, 1);
        class.fit.us(b, f, u)
    };
    assert!((at(8192) - 200.0 * fit(8192) / fit(2048)).abs() < 1e-9);
    assert!(at(8192) > 200.0);
    assert_eq!(class.gemm_table_us(64, 7168, 1536), None);
    assert_eq!(class.gemm_table_us(64, 576, 7168), None);
}
