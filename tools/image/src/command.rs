//! Running the host tools the image is made with (`ldd`, `ldconfig`, `tar`, `strip`), with errors
//! that name the command line and what it printed. [`describe`] and [`failure_text`] are the test
//! harness's too, so a failed command reads the same from both.

use std::process::{Command, Output};

use crate::error::{ImageError, Result};

/// Runs `cmd` to completion; fails with its stderr (and stdout, when any) when it exits non-zero.
pub(crate) fn run(cmd: &mut Command) -> Result<Output> {
    let output = output(cmd)?;
    if !output.status.success() {
        return Err(ImageError::Command {
            command: describe(cmd),
            status: output.status.to_string(),
            output: failure_text(&output),
        });
    }
    Ok(output)
}

/// Runs `cmd` to completion and returns its output whatever the exit status.
pub(crate) fn output(cmd: &mut Command) -> Result<Output> {
    cmd.output().map_err(|e| ImageError::Command {
        command: describe(cmd),
        status: "not started".into(),
        output: e.to_string(),
    })
}

/// What a failed command printed, for messages: its stderr, then its stdout when it wrote any.
pub fn failure_text(output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr);
    if output.stdout.is_empty() {
        stderr.trim().to_owned()
    } else {
        format!("{} | stdout: {}", stderr.trim(), String::from_utf8_lossy(&output.stdout).trim())
    }
}

/// A command line as text, for messages.
pub fn describe(cmd: &Command) -> String {
    let mut parts = vec![cmd.get_program().to_string_lossy().into_owned()];
    parts.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_command_is_named_with_its_stderr() {
        let err = run(Command::new("sh").args(["-c", "echo nope >&2; exit 3"])).unwrap_err().to_string();
        assert!(err.contains("`sh -c echo nope >&2; exit 3` failed") && err.contains("nope"), "{err}");
    }

    #[test]
    fn a_missing_program_is_not_started() {
        let err = output(&mut Command::new("/nonexistent/program")).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/program") && err.contains("not started"), "{err}");
    }
}
