//! Writes kipvs' CustomResourceDefinitions to `config/crd/` (or the given directory).
//!
//! usage: `crdgen [--check] [DIR]` (DIR defaults to `config/crd`). With `--check`, nothing is
//! written: the exit status is 1 and the differing files are named when DIR is not what the
//! types generate (CI's "generated files are committed" check).

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut check = false;
    let mut dir = PathBuf::from("config/crd");
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--check" => check = true,
            "-h" | "--help" => {
                eprintln!("usage: crdgen [--check] [DIR]   (DIR defaults to config/crd)");
                return ExitCode::SUCCESS;
            }
            _ => dir = PathBuf::from(arg),
        }
    }
    let files = match kipvs_crds::crd::files() {
        Ok(files) => files,
        Err(e) => {
            eprintln!("crdgen: cannot render the CRDs: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut stale = Vec::new();
    for (name, contents) in &files {
        let path = dir.join(name);
        let current = std::fs::read_to_string(&path).ok();
        if current.as_deref() == Some(contents.as_str()) {
            continue;
        }
        if check {
            stale.push(path.display().to_string());
        } else if let Err(e) =
            std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, contents))
        {
            eprintln!("crdgen: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        } else {
            println!("crdgen: wrote {}", path.display());
        }
    }
    if stale.is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "crdgen: {} differ from the types; run `cargo run -p kipvs-crds --bin crdgen` and commit the result",
            stale.join(", ")
        );
        ExitCode::FAILURE
    }
}
