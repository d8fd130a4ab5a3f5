//! `kheap completions SHELL` and `kheap man --dir DIR`: shell completions
//! and man pages generated from the same clap definitions the parser uses,
//! for packagers (docs/exports.md says where they go).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use clap_complete::Shell;

#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to complete for
    #[arg(value_enum)]
    pub shell: Shell,
}

#[derive(Args, Debug)]
pub struct ManArgs {
    /// Directory to write kheap.1, kheap-record.1, … into
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
}

/// Prints the completion script of `shell` for `cmd`.
pub fn completions(mut cmd: clap::Command, args: &CompletionsArgs) -> Result<i32> {
    let name = cmd.get_name().to_string();
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, name, &mut script);
    crate::output::emit(&String::from_utf8(script)?, None)?;
    Ok(0)
}

/// Writes one man page for `cmd` and one per subcommand into `--dir`
/// (created if missing), and lists the files written.
pub fn man(cmd: clap::Command, args: &ManArgs) -> Result<i32> {
    create_dir(&args.dir)?;
    crate::output::check_dir_writable(&args.dir, "--dir")?;
    let list: String = man_pages(cmd, &args.dir)?
        .iter()
        .map(|p| format!("{}\n", p.display()))
        .collect();
    crate::output::print(&list)?;
    Ok(0)
}

/// `--dir`: an existing directory, or one made now (with its missing
/// parents). A symbolic link is refused rather than followed: kheap runs as
/// root, and the link may be another user's.
fn create_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.file_type().is_symlink() => {
            // Another user's link in a sticky directory gets the same line
            // as every file kheap writes; any other link is refused too.
            crate::output::check_dir_writable(dir, "--dir")?;
            anyhow::bail!(
                "--dir {} is a symbolic link: give the directory it points to",
                dir.display()
            )
        }
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .with_context(|| format!("--dir {}: cannot create it", dir.display())),
        Err(e) => Err(e).with_context(|| format!("--dir {}", dir.display())),
    }
}

/// `kheap.1`, then `kheap-SUBCOMMAND.1` for each visible subcommand.
pub fn man_pages(cmd: clap::Command, dir: &Path) -> Result<Vec<PathBuf>> {
    let mut cmd = cmd.disable_help_subcommand(true);
    // Builds the `kheap-record` names of the subcommands.
    cmd.build();
    let mut pages = vec![cmd.clone()];
    pages.extend(cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
    let date = page_date(std::env::var("SOURCE_DATE_EPOCH").ok().as_deref())?;
    let source = format!("kheap {}", env!("CARGO_PKG_VERSION"));
    let mut written = Vec::new();
    for page in pages {
        // kheap's own page is "", a subcommand's its name.
        let sub = if page.get_name() == cmd.get_name() {
            String::new()
        } else {
            page.get_name().to_string()
        };
        let man = clap_mangen::Man::new(page)
            .date(&date)
            .source(&source)
            .manual("kheap manual");
        let mut text = Vec::new();
        man.render(&mut text)?;
        let page = with_sections(&tidy(&String::from_utf8(text)?), &sub);
        let path = dir.join(man.get_filename());
        // A page is written in place of a file, never through a link.
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
            anyhow::bail!(
                "{} is a symbolic link: remove it, or give another --dir",
                path.display()
            );
        }
        // Documentation, for everyone to read (the umask permitting).
        crate::output::write_file(&path, page.as_bytes(), crate::output::Readers::Everyone)
            .with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

/// The date in the pages' header: SOURCE_DATE_EPOCH's day when set (the
/// reproducible-builds convention packagers use), else today.
fn page_date(epoch: Option<&str>) -> Result<String> {
    let secs = match epoch {
        Some(e) => e
            .trim()
            .parse::<u64>()
            .with_context(|| format!("SOURCE_DATE_EPOCH={e} is not a number of seconds"))?,
        None => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs(),
    };
    Ok(crate::clock::date_utc(secs))
}

/// The page with its EXAMPLES and EXIT STATUS sections, before VERSION
/// (or at the end).
fn with_sections(page: &str, sub: &str) -> String {
    let sections = crate::help::roff_sections(sub);
    match page.find("\n.SH VERSION") {
        Some(i) => format!("{}\n{}{}", &page[..i], sections, &page[i + 1..]),
        None => format!("{page}{sections}"),
    }
}

/// clap_mangen separates a flag's help from its list of values with
/// `.br`, a blank line, `.br`: mandoc -T lint warns about both breaks. One
/// `.sp` is the same space.
fn tidy(page: &str) -> String {
    page.replace("\n.br\n\n.br\n", "\n.sp\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_days_of_the_epoch() {
        assert_eq!(page_date(Some("0")).unwrap(), "1970-01-01");
        assert_eq!(page_date(Some("951782400")).unwrap(), "2000-02-29");
        assert_eq!(page_date(Some("1764547200")).unwrap(), "2025-12-01");
        assert!(page_date(Some("yesterday")).is_err());
    }

    #[test]
    fn value_lists_are_spaced_once() {
        assert_eq!(tidy("help\n.br\n\n.br\nvalues"), "help\n.sp\nvalues");
    }
}
