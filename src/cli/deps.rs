//! `octofs deps list|gc|build`: the host's dependency layers as a table, what a collection
//! removed, what a build made (a failed build is the command's error, after its lines).

use octofs::layout::Layout;
use octofs::names::{NameKind, validate};
use octofs::proto::{self, BuildAnswer, GcAnswer, LayerInfo, OutcomeKind};

use super::args::DepsCmd;
use super::ask;
use super::output::{Text, ago, emit, mib, short};

pub fn run(layout: &Layout, cmd: DepsCmd) -> Result<(), String> {
    match cmd {
        DepsCmd::List(a) => emit(ask(layout, proto::DepsList)?, a.json),
        DepsCmd::Gc(a) => emit(ask(layout, proto::DepsGc)?, a.json),
        DepsCmd::Build(a) => {
            validate(NameKind::Project, &a.project)?;
            let req = proto::DepsBuild {
                project: a.project,
                git_ref: a.git_ref,
            };
            emit(ask(layout, req)?, a.json)
        }
    }
}

impl Text for Vec<LayerInfo> {
    fn print(self) -> Result<(), String> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        println!("KEY\tMANAGER\tPATH\tSTATE\tSIZE\tFILES\tBUILT\tTHREADS\tOWNERS");
        for l in self {
            println!(
                "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
                short(&l.key),
                l.manager.name(),
                l.path,
                l.state,
                mib(l.bytes),
                l.files,
                ago(now.saturating_sub(l.built_at)),
                if l.users.is_empty() {
                    "-".to_string()
                } else {
                    l.users.join(",")
                },
                if l.owners.is_empty() {
                    "-".to_string()
                } else {
                    l.owners.join(",")
                }
            );
            if let (Some(m), Some(log)) = (&l.message, &l.log) {
                println!("  {m} (see {})", log.display());
            }
        }
        Ok(())
    }
}

impl Text for GcAnswer {
    fn print(self) -> Result<(), String> {
        for r in &self.removed {
            println!(
                "removed {} layer {} ({}, {})",
                r.manager.name(),
                short(&r.key),
                r.state,
                mib(r.bytes)
            );
        }
        println!(
            "{} layer(s) removed, {} kept, {} freed",
            self.removed.len(),
            self.kept,
            mib(self.freed_bytes)
        );
        Ok(())
    }
}

impl Text for BuildAnswer {
    fn print(self) -> Result<(), String> {
        if self.outcomes.is_empty() {
            println!(
                "{} {}: no lockfile, no layer",
                self.project,
                short(&self.commit)
            );
        }
        let mut failed = 0;
        for o in &self.outcomes {
            if matches!(o.result, OutcomeKind::Failed { .. }) {
                failed += 1;
            }
            println!("{}", o.describe());
        }
        match failed {
            0 => Ok(()),
            n => Err(format!("{n} layer(s) failed to build")),
        }
    }
}
