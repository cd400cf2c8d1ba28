//! cgroup v2 files to `io.containerd.cgroups.v2.Metrics`, as containerd's cgroup2 package fills
//! them. CPU times stay in microseconds, the unit of cpu.stat; `max` limits become u64::MAX.

use std::path::Path;

use containerd_shim_protos::cgroups_v2::metrics::{
    CPUStat, HugeTlbStat, IOEntry, IOStat, MemoryEvents, MemoryStat, Metrics, PSIData, PSIStats, PidsStat,
};
use protobuf::MessageField;

use super::{get, parse_dev, read_keyed, read_opt, read_u64, CgroupError, Keyed};

/// A message whose named fields are the keyed file's entries of the same names (cpu.stat and
/// memory.events name their keys as containerd's fields), the rest default.
macro_rules! from_keys {
    ($kv:expr, $ty:ident { $($field:ident),* $(,)? }) => {
        $ty {
            $($field: get(&$kv, stringify!($field)),)*
            ..Default::default()
        }
    };
}

/// Reads the metrics of the v2 cgroup at `dir`. Sections whose controller is not enabled there
/// stay unset; [`CgroupError::Gone`] when `dir` no longer exists.
pub fn v2_metrics(dir: &Path) -> Result<Metrics, CgroupError> {
    if !dir.is_dir() {
        return Err(CgroupError::Gone(dir.to_path_buf()));
    }
    let mut m = Metrics::new();
    if let Some(current) = read_u64(&dir.join("pids.current"), u64::MAX)? {
        m.pids = MessageField::some(PidsStat {
            current,
            limit: read_u64(&dir.join("pids.max"), u64::MAX)?.unwrap_or(0),
            ..Default::default()
        });
    }
    if let Some(kv) = read_keyed(&dir.join("cpu.stat"))? {
        let fields = from_keys!(
            kv,
            CPUStat {
                usage_usec,
                user_usec,
                system_usec,
                nr_periods,
                nr_throttled,
                throttled_usec,
                nr_bursts,
                burst_usec
            }
        );
        m.cpu = MessageField::some(CPUStat {
            psi: psi(&dir.join("cpu.pressure"))?,
            ..fields
        });
    }
    m.memory = MessageField::from_option(memory(dir)?);
    if let Some(kv) = read_keyed(&dir.join("memory.events"))? {
        m.memory_events = MessageField::some(from_keys!(
            kv,
            MemoryEvents {
                low,
                high,
                max,
                oom,
                oom_kill,
                oom_group_kill
            }
        ));
    }
    let io_stat = read_opt(&dir.join("io.stat"))?;
    let io_psi = psi(&dir.join("io.pressure"))?;
    if io_stat.is_some() || io_psi.is_some() {
        m.io = MessageField::some(IOStat {
            usage: io_stat.as_deref().map(parse_io_stat).unwrap_or_default(),
            psi: io_psi,
            ..Default::default()
        });
    }
    m.hugetlb = hugetlb(dir)?;
    Ok(m)
}

fn memory(dir: &Path) -> Result<Option<MemoryStat>, CgroupError> {
    let usage = read_u64(&dir.join("memory.current"), u64::MAX)?;
    let stat = read_keyed(&dir.join("memory.stat"))?;
    if usage.is_none() && stat.is_none() {
        return Ok(None);
    }
    let kv = stat.unwrap_or_default();
    let g = |k: &str| get(&kv, k);
    let file = |name: &str| read_u64(&dir.join(name), u64::MAX);
    Ok(Some(MemoryStat {
        anon: g("anon"),
        file: g("file"),
        kernel_stack: g("kernel_stack"),
        slab: or_sum(&kv, "slab", &["slab_reclaimable", "slab_unreclaimable"]),
        sock: g("sock"),
        shmem: g("shmem"),
        file_mapped: g("file_mapped"),
        file_dirty: g("file_dirty"),
        file_writeback: g("file_writeback"),
        anon_thp: g("anon_thp"),
        inactive_anon: g("inactive_anon"),
        active_anon: g("active_anon"),
        inactive_file: g("inactive_file"),
        active_file: g("active_file"),
        unevictable: g("unevictable"),
        slab_reclaimable: g("slab_reclaimable"),
        slab_unreclaimable: g("slab_unreclaimable"),
        pgfault: g("pgfault"),
        pgmajfault: g("pgmajfault"),
        // Since Linux 5.9 these are split into _anon and _file.
        workingset_refault: or_sum(
            &kv,
            "workingset_refault",
            &["workingset_refault_anon", "workingset_refault_file"],
        ),
        workingset_activate: or_sum(
            &kv,
            "workingset_activate",
            &["workingset_activate_anon", "workingset_activate_file"],
        ),
        workingset_nodereclaim: g("workingset_nodereclaim"),
        pgrefill: g("pgrefill"),
        pgscan: g("pgscan"),
        pgsteal: g("pgsteal"),
        pgactivate: g("pgactivate"),
        pgdeactivate: g("pgdeactivate"),
        pglazyfree: g("pglazyfree"),
        pglazyfreed: g("pglazyfreed"),
        thp_fault_alloc: g("thp_fault_alloc"),
        thp_collapse_alloc: g("thp_collapse_alloc"),
        usage: usage.unwrap_or(0),
        usage_limit: file("memory.max")?.unwrap_or(0),
        swap_usage: file("memory.swap.current")?.unwrap_or(0),
        swap_limit: file("memory.swap.max")?.unwrap_or(0),
        max_usage: file("memory.peak")?.unwrap_or(0),
        swap_max_usage: file("memory.swap.peak")?.unwrap_or(0),
        psi: psi(&dir.join("memory.pressure"))?,
        ..Default::default()
    }))
}

/// `key` if the kernel reports it, else the sum of the parts newer kernels report instead.
fn or_sum(kv: &Keyed, key: &str, parts: &[&str]) -> u64 {
    kv.get(key)
        .copied()
        .unwrap_or_else(|| parts.iter().map(|p| get(kv, p)).sum())
}

/// `MAJ:MIN rbytes=.. wbytes=.. rios=.. wios=.. dbytes=.. dios=..` per device; unknown keys and
/// malformed tokens are skipped.
fn parse_io_stat(text: &str) -> Vec<IOEntry> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (major, minor) = parse_dev(f.next()?)?;
            let mut e = IOEntry {
                major,
                minor,
                ..Default::default()
            };
            for (k, v) in f.filter_map(|t| t.split_once('=')) {
                let Ok(v) = v.parse() else { continue };
                match k {
                    "rbytes" => e.rbytes = v,
                    "wbytes" => e.wbytes = v,
                    "rios" => e.rios = v,
                    "wios" => e.wios = v,
                    _ => {}
                }
            }
            Some(e)
        })
        .collect()
}

/// Pressure stall information (`some`/`full` lines of avg10 avg60 avg300 total), unset when
/// the kernel runs without PSI.
fn psi(path: &Path) -> Result<MessageField<PSIStats>, CgroupError> {
    let Some(text) = read_opt(path)? else {
        return Ok(MessageField::none());
    };
    let mut stats = PSIStats::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let slot = match f.next() {
            Some("some") => &mut stats.some,
            Some("full") => &mut stats.full,
            _ => continue,
        };
        let mut d = PSIData::new();
        for (k, v) in f.filter_map(|t| t.split_once('=')) {
            let bad = || CgroupError::Parse {
                path: path.to_path_buf(),
                text: line.to_string(),
            };
            match k {
                "avg10" => d.avg10 = v.parse().map_err(|_| bad())?,
                "avg60" => d.avg60 = v.parse().map_err(|_| bad())?,
                "avg300" => d.avg300 = v.parse().map_err(|_| bad())?,
                "total" => d.total = v.parse().map_err(|_| bad())?,
                _ => {}
            }
        }
        *slot = MessageField::some(d);
    }
    Ok(MessageField::some(stats))
}

/// One entry per huge page size (`hugetlb.2MB.current` ...); failcnt is the `max` count of
/// `hugetlb.<size>.events`, the allocations refused at the limit.
fn hugetlb(dir: &Path) -> Result<Vec<HugeTlbStat>, CgroupError> {
    super::hugetlb_sizes(dir, ".current")
        .into_iter()
        .map(|size| {
            let file = |n: &str| dir.join(format!("hugetlb.{size}.{n}"));
            Ok(HugeTlbStat {
                current: read_u64(&file("current"), u64::MAX)?.unwrap_or(0),
                max: read_u64(&file("max"), u64::MAX)?.unwrap_or(0),
                failcnt: read_keyed(&file("events"))?.map_or(0, |kv| get(&kv, "max")),
                pagesize: size,
                ..Default::default()
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroups::ContainerCgroup;
    use protobuf::Message;

    use crate::cgroups::write_files as write;

    /// A container cgroup as a 6.x kernel lays it out.
    fn fixture(dir: &Path) {
        write(
            dir,
            &[
                ("cgroup.events", "populated 1\nfrozen 0\n"),
                ("pids.current", "4\n"),
                ("pids.max", "max\n"),
                (
                    "cpu.stat",
                    "usage_usec 1234567\nuser_usec 1000000\nsystem_usec 234567\n\
                     core_sched.force_idle_usec 0\nnr_periods 20\nnr_throttled 5\n\
                     throttled_usec 45000\nnr_bursts 1\nburst_usec 300\n",
                ),
                (
                    "cpu.pressure",
                    "some avg10=1.50 avg60=0.25 avg300=0.00 total=123456\n\
                     full avg10=0.00 avg60=0.00 avg300=0.00 total=789\n",
                ),
                ("memory.current", "10485760\n"),
                ("memory.max", "max\n"),
                ("memory.swap.current", "0\n"),
                ("memory.swap.max", "1048576\n"),
                ("memory.peak", "20971520\n"),
                (
                    "memory.stat",
                    "anon 4194304\nfile 5242880\nkernel 600000\nkernel_stack 32768\n\
                     pagetables 40960\nsec_pagetables 0\npercpu 1000\nsock 4096\nvmalloc 0\n\
                     shmem 8192\nzswap 0\nzswapped 0\nfile_mapped 1048576\nfile_dirty 4096\n\
                     file_writeback 0\nswapcached 0\nanon_thp 2097152\nfile_thp 0\n\
                     shmem_thp 0\ninactive_anon 1000\nactive_anon 4190000\n\
                     inactive_file 5000000\nactive_file 242880\nunevictable 0\n\
                     slab_reclaimable 70000\nslab_unreclaimable 30000\nslab 100000\n\
                     workingset_refault_anon 3\nworkingset_refault_file 4\n\
                     workingset_activate_anon 5\nworkingset_activate_file 6\n\
                     workingset_restore_anon 0\nworkingset_restore_file 0\n\
                     workingset_nodereclaim 7\npgscan 8\npgsteal 9\npgfault 1500\n\
                     pgmajfault 12\npgrefill 10\npgactivate 11\npgdeactivate 13\n\
                     pglazyfree 14\npglazyfreed 15\nthp_fault_alloc 16\nthp_collapse_alloc 17\n",
                ),
                (
                    "memory.events",
                    "low 1\nhigh 2\nmax 3\noom 4\noom_kill 5\noom_group_kill 6\n",
                ),
                (
                    "io.stat",
                    "8:0 rbytes=4096 wbytes=8192 rios=1 wios=2 dbytes=0 dios=0\n\
                     253:1 rbytes=10 wbytes=20 rios=3 wios=4 dbytes=0 dios=0\n",
                ),
                ("hugetlb.2MB.current", "2097152\n"),
                ("hugetlb.2MB.max", "max\n"),
                ("hugetlb.2MB.events", "max 7\n"),
                ("hugetlb.2MB.rsvd.current", "0\n"),
            ],
        );
    }

    #[test]
    fn maps_cpu_in_usec_and_max_to_u64_max() {
        let d = tempfile::tempdir().unwrap();
        fixture(d.path());
        let m = v2_metrics(d.path()).unwrap();

        assert_eq!((m.pids.current, m.pids.limit), (4, u64::MAX));

        let c = &m.cpu;
        assert_eq!(
            (c.usage_usec, c.user_usec, c.system_usec),
            (1_234_567, 1_000_000, 234_567)
        );
        assert_eq!((c.nr_periods, c.nr_throttled, c.throttled_usec), (20, 5, 45_000));
        assert_eq!((c.nr_bursts, c.burst_usec), (1, 300));
        assert_eq!(c.psi.some.avg10, 1.5);
        assert_eq!(c.psi.some.total, 123_456);
        assert_eq!(c.psi.full.total, 789);

        let mem = &m.memory;
        assert_eq!(mem.usage, 10_485_760);
        assert_eq!(mem.usage_limit, u64::MAX);
        assert_eq!((mem.swap_usage, mem.swap_limit), (0, 1_048_576));
        assert_eq!((mem.max_usage, mem.swap_max_usage), (20_971_520, 0));
        assert_eq!((mem.anon, mem.file), (4_194_304, 5_242_880));
        assert_eq!((mem.kernel_stack, mem.sock, mem.shmem), (32768, 4096, 8192));
        assert_eq!((mem.file_mapped, mem.file_dirty), (1_048_576, 4096));
        assert_eq!(mem.anon_thp, 2_097_152);
        assert_eq!((mem.inactive_file, mem.active_file), (5_000_000, 242_880));
        assert_eq!((mem.slab, mem.slab_reclaimable), (100_000, 70_000));
        assert_eq!((mem.pgfault, mem.pgmajfault), (1500, 12));
        assert_eq!((mem.workingset_refault, mem.workingset_activate), (7, 11));
        assert_eq!(mem.workingset_nodereclaim, 7);
        assert_eq!((mem.pgrefill, mem.pgscan, mem.pgsteal), (10, 8, 9));
        assert_eq!((mem.thp_fault_alloc, mem.thp_collapse_alloc), (16, 17));
        assert!(mem.psi.is_none());

        let e = &m.memory_events;
        assert_eq!(
            (e.low, e.high, e.max, e.oom, e.oom_kill, e.oom_group_kill),
            (1, 2, 3, 4, 5, 6)
        );

        let io = &m.io.usage;
        assert_eq!(io.len(), 2);
        assert_eq!(
            (
                io[0].major,
                io[0].minor,
                io[0].rbytes,
                io[0].wbytes,
                io[0].rios,
                io[0].wios
            ),
            (8, 0, 4096, 8192, 1, 2)
        );
        assert_eq!((io[1].major, io[1].minor, io[1].wios), (253, 1, 4));

        assert_eq!(m.hugetlb.len(), 1);
        let h = &m.hugetlb[0];
        assert_eq!(
            (h.pagesize.as_str(), h.current, h.max, h.failcnt),
            ("2MB", 2_097_152, u64::MAX, 7)
        );
    }

    /// libcgroups' own v2 reader (its manager can be rooted at any directory) on the same tree,
    /// against what containerd reports; the table in `cgroups/mod.rs` sums it up.
    #[test]
    fn libcgroups_v2_stats_lack_what_containerd_reports() {
        use libcgroups::common::CgroupManager;

        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("c1");
        fixture(&dir);
        let manager = libcgroups::v2::manager::Manager::new(root.path().to_path_buf(), "c1".into()).unwrap();
        // libcgroups reads the files of each huge page size the host (not the cgroup) has; on a
        // host without /sys/kernel/mm/hugepages it cannot read any cgroup's stats.
        let sizes = libcgroups::stats::supported_page_sizes().expect("host huge page sizes");
        for size in sizes.iter().filter(|s| *s != "2MB") {
            let (current, max, events) = (
                format!("hugetlb.{size}.current"),
                format!("hugetlb.{size}.max"),
                format!("hugetlb.{size}.events"),
            );
            write(&dir, &[(&current, "0\n"), (&max, "max\n"), (&events, "max 0\n")]);
        }
        let ours = v2_metrics(&dir).unwrap();

        // A kernel booted without PSI (psi=0) has no *.pressure files: libcgroups answers
        // nothing at all, where containerd (and gantry) leave only the PSI unset.
        let e = manager.stats().unwrap_err();
        assert!(e.to_string().contains("pressure"), "{e}");
        assert!(ours.memory.psi.is_none() && ours.memory.usage == 10_485_760);
        // Likewise when a memory.swap.* file is absent, as all are without swap accounting.
        write(
            &dir,
            &[
                ("memory.pressure", "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"),
                ("io.pressure", "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"),
            ],
        );
        let e = manager.stats().unwrap_err();
        assert!(e.to_string().contains("memory.swap.events"), "{e}");

        write(&dir, &[("memory.swap.events", "high 0\nmax 0\nfail 0\n")]);
        let theirs = manager.stats().unwrap();
        let ours = v2_metrics(&dir).unwrap();

        // Where they agree (same files, same unit: µs for CPU, bytes, `max` as u64::MAX).
        let (c, u) = (&ours.cpu, &theirs.cpu.usage);
        assert_eq!(
            (u.usage_total, u.usage_user, u.usage_kernel),
            (c.usage_usec, c.user_usec, c.system_usec)
        );
        let t = &theirs.cpu.throttling;
        assert_eq!(
            (t.periods, t.throttled_periods, t.throttled_time),
            (c.nr_periods, c.nr_throttled, c.throttled_usec)
        );
        let (m, mem) = (&theirs.memory.memory, &ours.memory);
        assert_eq!(
            (m.usage, m.limit, m.max_usage),
            (mem.usage, mem.usage_limit, mem.max_usage)
        );
        let swap = &theirs.memory.memswap;
        assert_eq!((swap.usage, swap.limit), (mem.swap_usage, mem.swap_limit));
        // memory.stat only as the raw map: each of containerd's fields is a lookup away.
        assert_eq!(theirs.memory.stats["anon"], mem.anon);
        assert_eq!(theirs.cpu.psi.some.avg10, c.psi.some.avg10);
        // io.stat split into one entry per op; containerd's IOEntry holds them together.
        let read = theirs
            .blkio
            .service_bytes
            .iter()
            .find(|e| (e.major, e.minor, e.op_type.as_deref()) == (8, 0, Some("read")))
            .unwrap();
        assert_eq!(read.value, ours.io.usage[0].rbytes);
        let huge = ours.hugetlb.iter().find(|h| h.pagesize == "2MB").unwrap();
        assert_eq!(theirs.hugetlb["2MB"].usage, huge.current);
        assert_eq!(theirs.hugetlb["2MB"].fail_count, huge.failcnt);

        // Where they differ.
        // pids.max `max`: containerd's v2 reports u64::MAX, libcgroups 0 (the v1 convention).
        assert_eq!((theirs.pids.limit, ours.pids.limit), (0, u64::MAX));
        // memory.events: libcgroups keeps only `oom`, as the memory fail count; the OOM-kill
        // counter (and low, high, max, oom_group_kill) is not there.
        assert_eq!(m.fail_count, 4);
        let ev = &ours.memory_events;
        assert_eq!((ev.oom, ev.oom_kill, ev.oom_group_kill), (4, 5, 6));
        // hugetlb: no limit (containerd's `max`, hugetlb.<size>.max) in libcgroups.
        assert_eq!((theirs.hugetlb["2MB"].max_usage, huge.max), (0, u64::MAX));
        // Fields libcgroups' types have no place for at all (so nothing to compare): PSI
        // `total`, cpu.stat nr_bursts and burst_usec.
        assert_eq!((c.psi.some.total, c.nr_bursts, c.burst_usec), (123_456, 1, 300));
    }

    #[test]
    fn older_kernels_fields_are_used_as_is() {
        let d = tempfile::tempdir().unwrap();
        write(
            d.path(),
            &[
                ("memory.current", "1\n"),
                ("memory.max", "536870912\n"),
                (
                    "memory.stat",
                    "slab_reclaimable 3\nslab_unreclaimable 4\nworkingset_refault 9\n",
                ),
            ],
        );
        let m = v2_metrics(d.path()).unwrap();
        assert_eq!(m.memory.usage_limit, 536_870_912);
        assert_eq!(m.memory.slab, 7);
        assert_eq!(m.memory.workingset_refault, 9);
        assert_eq!(m.memory.workingset_activate, 0);
    }

    #[test]
    fn cgroup_without_controllers_gives_only_what_it_has() {
        // What a child of a cgroup2 hierarchy with no controllers enabled offers.
        let d = tempfile::tempdir().unwrap();
        write(
            d.path(),
            &[
                ("cgroup.events", "populated 0\nfrozen 0\n"),
                ("cpu.stat", "usage_usec 5\nuser_usec 3\nsystem_usec 2\n"),
                ("io.pressure", "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"),
            ],
        );
        let m = v2_metrics(d.path()).unwrap();
        assert_eq!(m.cpu.usage_usec, 5);
        assert!(m.cpu.psi.is_none());
        assert!(m.pids.is_none() && m.memory.is_none() && m.memory_events.is_none());
        assert!(m.io.usage.is_empty() && m.io.psi.some.is_some());
        assert!(m.hugetlb.is_empty());
        let cg = ContainerCgroup::v2_at(d.path().to_path_buf());
        assert!(matches!(cg.oom_kills(), Err(CgroupError::OomUnsupported(_))));
    }

    #[test]
    fn bad_values_are_reported() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), &[("memory.current", "lots\n")]);
        assert!(matches!(v2_metrics(d.path()), Err(CgroupError::Parse { .. })));
        write(
            d.path(),
            &[
                ("memory.current", "1\n"),
                ("cpu.stat", "usage_usec 1\n"),
                ("cpu.pressure", "some avg10=x\n"),
            ],
        );
        assert!(matches!(v2_metrics(d.path()), Err(CgroupError::Parse { .. })));
    }

    #[test]
    fn any_carries_the_v2_type_url() {
        let d = tempfile::tempdir().unwrap();
        fixture(d.path());
        let cg = ContainerCgroup::v2_at(d.path().to_path_buf());
        assert!(cg.is_v2());
        let any = cg.metrics_any().unwrap();
        assert_eq!(any.type_url, "io.containerd.cgroups.v2.Metrics");
        let m = Metrics::parse_from_bytes(&any.value).unwrap();
        assert_eq!(m.cpu.usage_usec, 1_234_567);
        assert_eq!(m.memory.usage_limit, u64::MAX);
        assert_eq!(cg.oom_kills().unwrap(), 5);
    }
}
