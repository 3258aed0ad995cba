//! A server process (ring0 or an upstream fixture) whose stderr lines are collected, so a test
//! can wait for what it says and read it back; killed on drop.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Longest a test waits for a server to say something.
pub const SERVED_WAIT: Duration = Duration::from_secs(60);

/// A server process whose stderr is collected; killed on drop.
pub struct Served {
    pub child: Child,
    /// The URL it printed (`listening on URL`), empty for a server that does not listen.
    pub url: String,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Served {
    /// Starts `cmd` and collects its stderr; when `listens`, waits for the address it prints
    /// (`listening on http://ADDR/mcp`).
    pub fn start(mut cmd: Command, listens: bool) -> Self {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        let mut served = Self {
            child,
            url: String::new(),
            lines,
        };
        if listens {
            let line = served.wait_for_line("listening on http://");
            served.url = line.split("listening on ").nth(1).unwrap().trim().into();
        }
        served
    }

    /// Waits (up to [`SERVED_WAIT`]) for a stderr line containing `needle`.
    pub fn wait_for_line(&self, needle: &str) -> String {
        let deadline = Instant::now() + SERVED_WAIT;
        loop {
            if let Some(l) = self.lines().into_iter().find(|l| l.contains(needle)) {
                return l;
            }
            assert!(
                Instant::now() < deadline,
                "no line with {needle:?} in:\n{}",
                self.lines().join("\n")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Every stderr line so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// Whether a stderr line so far contains `needle`.
    pub fn has_line(&self, needle: &str) -> bool {
        self.count(needle) > 0
    }

    /// How many stderr lines so far contain `needle`.
    pub fn count(&self, needle: &str) -> usize {
        self.lines().iter().filter(|l| l.contains(needle)).count()
    }
}
