#!/usr/bin/env bash
# Re-creates the terminal captures of this corpus: each command runs under a pseudo-terminal
# (`script` from util-linux) so that tools draw their colours and progress bars as a person sees
# them, and the raw bytes are kept in NAME.raw. The `script` header and footer lines are removed,
# and registry host names are replaced by the word "registry".
# Needs: script (bsdutils), cargo, rustc, gcc, git, python3 with pip and pytest, npm, network
# access to the package registries. Captures differ run to run (timings, versions); after
# re-capturing, regenerate the expected outputs with
#   RING0_SHAPE_BLESS=1 cargo test -p ring0-shape --test corpus
# and review the diff.
set -euo pipefail
out="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"

capture() { # name, command
  local name="$1" cmd="$2"
  script -q -e -c "stty cols 100 rows 30; $cmd" "$work/$name.typescript" >/dev/null || true
  # Drop the first line (script's header) and the trailing footer.
  sed -e '1d' -e '/^Script done on /d' -e 's/crates\.io index/registry index/' \
    "$work/$name.typescript" > "$out/$name.raw"
}

# cargo build with its progress bar, cargo test with a failing test, a rustc error.
cargo new -q --lib demo && cd demo
cat >> Cargo.toml <<'TOML'
itoa = "1"
ryu = "1"
TOML
cat > src/lib.rs <<'RS'
pub fn add(a: u64, b: u64) -> u64 { a + b }
#[cfg(test)]
mod tests {
    #[test]
    fn adds() { assert_eq!(super::add(2, 2), 4); }
    #[test]
    fn adds_wrong() { assert_eq!(super::add(2, 2), 5, "arithmetic is broken"); }
}
RS
CARGO_TERM_PROGRESS_WHEN=always CARGO_TERM_PROGRESS_WIDTH=100 capture cargo_build "cargo build --color=always"
capture cargo_test_failure "cargo test --color=always -q"
cd "$work"
cat > bad.rs <<'RS'
fn main() {
    let n: u32 = "four";
    println!("{}", n);
}
RS
capture rustc_error "rustc --color=always bad.rs"

# pip download with its progress bar.
capture pip_download "pip download --no-deps --no-cache-dir --progress-bar on -d $work/wheels pygments==2.17.2"

# npm install with its progress display.
mkdir npmdemo && cd npmdemo && npm init -y >/dev/null
capture npm_install "npm install --color=always --no-audit --no-fund is-number@7"
cd "$work"

# pytest failure with colour, a Python traceback.
mkdir -p pyproj/tests && cd pyproj
cat > tests/test_calc.py <<'PY'
def total(xs):
    return sum(xs) + 1

def test_total_of_nothing():
    assert total([]) == 0

def test_total_of_one():
    assert total([1]) == 2
PY
capture pytest_failure "python3 -m pytest --color=yes tests"
cat > app.py <<'PY'
import json

def load(text):
    return json.loads(text)

def main():
    config = load("{not json")
    print(config)

main()
PY
capture python_traceback "python3 app.py"
cd "$work"

# gcc error.
cat > bad.c <<'C'
#include <stdio.h>
int main(void) {
    int x = 1
    printf("%d\n", x);
    return 0;
}
C
capture gcc_error "gcc -fdiagnostics-color=always -c bad.c -o bad.o"

# git clone progress from a local repository.
git init -q src-repo && cd src-repo
for i in $(seq 1 400); do head -c 2000 /dev/urandom | base64 > "f$i.txt"; done
git add . && git -c user.name=x -c user.email=x@x commit -q -m init
cd "$work"
capture git_clone "git clone --progress file://$work/src-repo clone"
