//! Real terminal captures (made through a pseudo-terminal by `tests/corpus/capture.sh`) shaped
//! and compared with their reviewed expected text, and the diagnostics each must yield.
//!
//! `RING0_SHAPE_BLESS=1 cargo test -p ring0-shape --test corpus` rewrites the expected files after
//! a deliberate change; review the diff before committing it.

use std::path::PathBuf;

use ring0_core::observation::{Diagnostic, Location, Severity, TestRunner};
use ring0_shape::{Observation, ShapeConfig, shape_bytes};

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

fn config() -> ShapeConfig {
    ShapeConfig {
        count_tokens: false,
        ..ShapeConfig::default()
    }
}

/// Shapes a capture and checks its text against `NAME.expected.txt`.
fn shaped(name: &str) -> Observation {
    let dir = corpus_dir();
    let raw = std::fs::read(dir.join(format!("{name}.raw"))).expect("capture exists");
    let obs = shape_bytes(&raw, &config()).expect("default config is valid");
    let expected_path = dir.join(format!("{name}.expected.txt"));
    if std::env::var_os("RING0_SHAPE_BLESS").is_some() {
        std::fs::write(&expected_path, &obs.text).expect("write expected");
    }
    let expected = std::fs::read_to_string(&expected_path).expect("expected output exists");
    assert_eq!(
        obs.text, expected,
        "{name}: shaped text differs from {expected_path:?}"
    );
    assert!(!obs.text.contains('\u{1b}'), "{name}: an escape survived");
    assert!(
        !obs.text.contains('\r'),
        "{name}: a carriage return survived"
    );
    obs
}

fn at(file: &str, line: u32, column: Option<u32>) -> Option<Location> {
    Some(Location {
        file: file.into(),
        line: Some(line),
        column,
        function: None,
    })
}

#[test]
fn cargo_build_progress_collapses_to_the_compile_lines() {
    let obs = shaped("cargo_build");
    assert!(!obs.text.contains("Building ["), "progress frames remain");
    assert!(obs.text.contains("Compiling demo v0.1.0"));
    assert!(obs.text.contains("Finished `dev` profile"));
    assert!(obs.diagnostics.is_empty());
}

#[test]
fn cargo_test_failure_yields_the_panic_and_the_summary() {
    let obs = shaped("cargo_test_failure");
    let panic = obs
        .diagnostics
        .iter()
        .find_map(|d| match d {
            Diagnostic::RustPanic {
                thread,
                message,
                location,
                ..
            } => Some((thread, message, location)),
            _ => None,
        })
        .expect("the panic is found");
    assert_eq!(panic.0, "tests::adds_wrong");
    assert!(
        panic
            .1
            .starts_with("assertion `left == right` failed: arithmetic is broken")
    );
    assert_eq!(*panic.2, at("src/lib.rs", 7, Some(23)));
    assert!(obs.diagnostics.iter().any(|d| matches!(d,
        Diagnostic::TestSummary { runner: TestRunner::CargoTest, passed: 1, failed: 1, failures, .. }
            if failures == &vec!["tests::adds_wrong".to_string()])));
}

#[test]
fn rustc_error_yields_code_message_and_location() {
    let obs = shaped("rustc_error");
    assert_eq!(
        obs.diagnostics,
        vec![Diagnostic::Rustc {
            stream: ring0_core::observation::StreamName::Stdout,
            severity: Severity::Error,
            code: Some("E0308".into()),
            message: "mismatched types".into(),
            location: at("bad.rs", 2, Some(18)),
        }]
    );
}

#[test]
fn pip_download_progress_bar_collapses_to_its_final_state() {
    let obs = shaped("pip_download");
    assert!(obs.text.contains("1.2/1.2 MB"));
    assert!(
        !obs.text.contains("0.0/1.2 MB"),
        "an intermediate frame remains"
    );
}

#[test]
fn npm_install_spinner_leaves_only_the_result() {
    let obs = shaped("npm_install");
    assert!(obs.text.contains("added 1 package"));
    assert!(!obs.text.contains('⠙'), "a spinner frame remains");
}

#[test]
fn pytest_failure_yields_the_summary_with_the_failing_test() {
    let obs = shaped("pytest_failure");
    assert!(obs.diagnostics.iter().any(|d| matches!(d,
        Diagnostic::TestSummary { runner: TestRunner::Pytest, passed: 1, failed: 1, failures, .. }
            if failures == &vec!["tests/test_calc.py::test_total_of_nothing".to_string()])));
}

#[test]
fn python_traceback_points_at_the_innermost_frame_outside_the_standard_library() {
    let obs = shaped("python_traceback");
    let [
        Diagnostic::PythonException {
            exception,
            message,
            location: Some(location),
            frames,
            ..
        },
    ] = obs.diagnostics.as_slice()
    else {
        panic!("one traceback expected, got {:?}", obs.diagnostics);
    };
    assert_eq!(exception, "json.decoder.JSONDecodeError");
    assert!(message.starts_with("Expecting property name enclosed in double quotes"));
    assert!(location.file.ends_with("pyproj/app.py"));
    assert_eq!(location.line, Some(4));
    assert_eq!(location.function.as_deref(), Some("load"));
    assert_eq!(*frames, 6);
}

#[test]
fn gcc_error_yields_file_line_column_and_message() {
    let obs = shaped("gcc_error");
    assert_eq!(
        obs.diagnostics,
        vec![Diagnostic::CCompiler {
            stream: ring0_core::observation::StreamName::Stdout,
            severity: Severity::Error,
            message: "expected ‘,’ or ‘;’ before ‘printf’".into(),
            location: at("bad.c", 4, Some(5)).unwrap(),
        }]
    );
}

#[test]
fn git_clone_progress_collapses_to_one_line_per_phase() {
    let obs = shaped("git_clone");
    for phase in [
        "Counting objects: 100%",
        "Compressing objects: 100%",
        "Receiving objects: 100%",
        "Resolving deltas: 100%",
    ] {
        let count = obs.text.matches(phase.split(':').next().unwrap()).count();
        assert!(count <= 1, "{phase}: {count} lines");
    }
    assert!(obs.text.contains("Receiving objects: 100%"));
    assert!(!obs.text.contains("Receiving objects:  50%"));
}
