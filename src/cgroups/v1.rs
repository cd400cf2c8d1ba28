//! cgroup v1 files to `io.containerd.cgroups.v1.Metrics`, field for field as containerd's
//! cgroup1 package fills them. CPU times are nanoseconds.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::Path;

use containerd_shim_protos::cgroups::metrics::{
    BlkIOEntry, BlkIOStat, CPUStat, CPUUsage, HugetlbStat, MemoryEntry, MemoryOomControl, MemoryStat, Metrics,
    PidsStat, Throttle,
};
use libcgroups::common::WrappedIoError;
use libcgroups::stats::PidStatsError;
use protobuf::MessageField;

use super::{get, parse_dev, parse_value, read_keyed, read_opt, read_u64, CgroupError, V1Paths};

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// Reads the metrics of a v1 cgroup. Sections whose controller or files are absent stay unset;
/// [`CgroupError::Gone`] when none of the directories exists any more.
pub fn v1_metrics(paths: &V1Paths) -> Result<Metrics, CgroupError> {
    if let Some(first) = paths.dirs().next() {
        if !paths.dirs().any(|d| d.is_dir()) {
            return Err(CgroupError::Gone(first.clone()));
        }
    }
    let mut m = Metrics::new();
    if let Some(dir) = &paths.pids {
        m.pids = MessageField::from_option(pids(dir)?);
    }
    let usage = paths.cpuacct.as_deref().map(cpu_usage).transpose()?.flatten();
    let throttling = paths.cpu.as_deref().map(throttling).transpose()?.flatten();
    if usage.is_some() || throttling.is_some() {
        m.cpu = MessageField::some(CPUStat {
            usage: MessageField::from_option(usage),
            throttling: MessageField::from_option(throttling),
            ..Default::default()
        });
    }
    if let Some(dir) = &paths.memory {
        m.memory = MessageField::from_option(memory(dir)?);
        m.memory_oom_control = MessageField::from_option(oom_control(dir)?);
    }
    if let Some(dir) = &paths.blkio {
        m.blkio = MessageField::from_option(blkio(dir)?);
    }
    if let Some(dir) = &paths.hugetlb {
        m.hugetlb = hugetlb(dir)?;
    }
    Ok(m)
}

/// pids.current and pids.max through libcgroups, whose reading is containerd's v1 one: a
/// `max` limit is 0, "no limit". Unset when the files are absent.
fn pids(dir: &Path) -> Result<Option<PidsStat>, CgroupError> {
    let bad = |name: &str| {
        let path = dir.join(name);
        let text = fs::read_to_string(&path).unwrap_or_default().trim().to_string();
        CgroupError::Parse { path, text }
    };
    match libcgroups::stats::pid_stats(dir) {
        Ok(s) => Ok(Some(PidsStat {
            current: s.current,
            limit: s.limit,
            ..Default::default()
        })),
        Err(PidStatsError::WrappedIo(e)) => {
            let (WrappedIoError::Open { err, path }
            | WrappedIoError::Read { err, path }
            | WrappedIoError::Write { err, path, .. }
            | WrappedIoError::CreateDir { err, path }
            | WrappedIoError::Other { err, path }) = e;
            match err.kind() {
                io::ErrorKind::NotFound => Ok(None),
                _ => Err(CgroupError::Io { path, source: err }),
            }
        }
        Err(PidStatsError::ParseCurrent(_)) => Err(bad("pids.current")),
        Err(PidStatsError::ParseLimit(_)) => Err(bad("pids.max")),
    }
}

/// cpuacct.usage and usage_percpu are ns. User/kernel come from the ns files usage_user and
/// usage_sys when the kernel has them, else from cpuacct.stat, which counts USER_HZ ticks.
fn cpu_usage(dir: &Path) -> Result<Option<CPUUsage>, CgroupError> {
    let Some(total) = read_u64(&dir.join("cpuacct.usage"), 0)? else {
        return Ok(None);
    };
    let per_cpu = match read_opt(&dir.join("cpuacct.usage_percpu"))? {
        Some(text) => {
            let path = dir.join("cpuacct.usage_percpu");
            text.split_whitespace()
                .map(|v| parse_value(&path, v, 0))
                .collect::<Result<Vec<_>, _>>()?
        }
        None => Vec::new(),
    };
    let user_ns = read_u64(&dir.join("cpuacct.usage_user"), 0)?;
    let sys_ns = read_u64(&dir.join("cpuacct.usage_sys"), 0)?;
    let (user, kernel) = match (user_ns, sys_ns) {
        (Some(u), Some(s)) => (u, s),
        _ => match read_keyed(&dir.join("cpuacct.stat"))? {
            Some(kv) => {
                let hz = clock_ticks();
                (ticks_to_ns(get(&kv, "user"), hz), ticks_to_ns(get(&kv, "system"), hz))
            }
            None => (0, 0),
        },
    };
    Ok(Some(CPUUsage {
        total,
        kernel,
        user,
        per_cpu,
        ..Default::default()
    }))
}

/// USER_HZ, the unit of cpuacct.stat (100 on every Linux ABI, but ask).
fn clock_ticks() -> u64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        Ok(Some(hz)) if hz > 0 => hz.unsigned_abs(),
        _ => 100,
    }
}

fn ticks_to_ns(ticks: u64, hz: u64) -> u64 {
    let ns = u128::from(ticks) * NANOS_PER_SEC / u128::from(hz.max(1));
    u64::try_from(ns).unwrap_or(u64::MAX)
}

/// cpu.stat of the cpu controller; throttled_time is ns.
fn throttling(dir: &Path) -> Result<Option<Throttle>, CgroupError> {
    Ok(read_keyed(&dir.join("cpu.stat"))?.map(|kv| Throttle {
        periods: get(&kv, "nr_periods"),
        throttled_periods: get(&kv, "nr_throttled"),
        throttled_time: get(&kv, "throttled_time"),
        ..Default::default()
    }))
}

fn memory(dir: &Path) -> Result<Option<MemoryStat>, CgroupError> {
    let Some(kv) = read_keyed(&dir.join("memory.stat"))? else {
        return Ok(None);
    };
    let g = |k: &str| get(&kv, k);
    Ok(Some(MemoryStat {
        cache: g("cache"),
        rss: g("rss"),
        rss_huge: g("rss_huge"),
        mapped_file: g("mapped_file"),
        dirty: g("dirty"),
        writeback: g("writeback"),
        pg_pg_in: g("pgpgin"),
        pg_pg_out: g("pgpgout"),
        pg_fault: g("pgfault"),
        pg_maj_fault: g("pgmajfault"),
        inactive_anon: g("inactive_anon"),
        active_anon: g("active_anon"),
        inactive_file: g("inactive_file"),
        active_file: g("active_file"),
        unevictable: g("unevictable"),
        hierarchical_memory_limit: g("hierarchical_memory_limit"),
        hierarchical_swap_limit: g("hierarchical_memsw_limit"),
        total_cache: g("total_cache"),
        total_rss: g("total_rss"),
        total_rss_huge: g("total_rss_huge"),
        total_mapped_file: g("total_mapped_file"),
        total_dirty: g("total_dirty"),
        total_writeback: g("total_writeback"),
        total_pg_pg_in: g("total_pgpgin"),
        total_pg_pg_out: g("total_pgpgout"),
        total_pg_fault: g("total_pgfault"),
        total_pg_maj_fault: g("total_pgmajfault"),
        total_inactive_anon: g("total_inactive_anon"),
        total_active_anon: g("total_active_anon"),
        total_inactive_file: g("total_inactive_file"),
        total_active_file: g("total_active_file"),
        total_unevictable: g("total_unevictable"),
        usage: memory_entry(dir, "memory")?,
        // memsw is memory+swap, which is what containerd reports as "swap" on v1.
        swap: memory_entry(dir, "memory.memsw")?,
        kernel: memory_entry(dir, "memory.kmem")?,
        kernel_tcp: memory_entry(dir, "memory.kmem.tcp")?,
        ..Default::default()
    }))
}

/// `<prefix>.usage_in_bytes` and friends, unset when the kernel lacks them (memsw without swap
/// accounting, kmem on newer kernels). Limits are passed through as the kernel prints them.
fn memory_entry(dir: &Path, prefix: &str) -> Result<MessageField<MemoryEntry>, CgroupError> {
    let file = |name: &str| dir.join(format!("{prefix}.{name}"));
    let Some(usage) = read_u64(&file("usage_in_bytes"), 0)? else {
        return Ok(MessageField::none());
    };
    Ok(MessageField::some(MemoryEntry {
        usage,
        max: read_u64(&file("max_usage_in_bytes"), 0)?.unwrap_or(0),
        failcnt: read_u64(&file("failcnt"), 0)?.unwrap_or(0),
        limit: read_u64(&file("limit_in_bytes"), 0)?.unwrap_or(0),
        ..Default::default()
    }))
}

fn oom_control(dir: &Path) -> Result<Option<MemoryOomControl>, CgroupError> {
    Ok(read_keyed(&dir.join("memory.oom_control"))?.map(|kv| MemoryOomControl {
        oom_kill_disable: get(&kv, "oom_kill_disable"),
        under_oom: get(&kv, "under_oom"),
        oom_kill: get(&kv, "oom_kill"),
        ..Default::default()
    }))
}

/// Byte and operation counts per device and op. The CFQ `_recursive` files are gone from modern
/// kernels, so the throttle files (which count every bio of the cgroup) stand in, recursive
/// first, as containerd does.
fn blkio(dir: &Path) -> Result<Option<BlkIOStat>, CgroupError> {
    let mut names = HashMap::new();
    let bytes = blkio_entries(
        dir,
        &[
            "blkio.io_service_bytes_recursive",
            "blkio.throttle.io_service_bytes_recursive",
            "blkio.throttle.io_service_bytes",
        ],
        &mut names,
    )?;
    let ops = blkio_entries(
        dir,
        &[
            "blkio.io_serviced_recursive",
            "blkio.throttle.io_serviced_recursive",
            "blkio.throttle.io_serviced",
        ],
        &mut names,
    )?;
    match (bytes, ops) {
        (None, None) => Ok(None),
        (bytes, ops) => Ok(Some(BlkIOStat {
            io_service_bytes_recursive: bytes.unwrap_or_default(),
            io_serviced_recursive: ops.unwrap_or_default(),
            ..Default::default()
        })),
    }
}

/// The entries of the first candidate file that has any; `None` if no candidate exists.
fn blkio_entries(
    dir: &Path,
    candidates: &[&str],
    names: &mut HashMap<(u64, u64), String>,
) -> Result<Option<Vec<BlkIOEntry>>, CgroupError> {
    let mut found = None;
    for name in candidates {
        let path = dir.join(name);
        let Some(text) = read_opt(&path)? else {
            continue;
        };
        let entries = parse_blkio(&path, &text, names)?;
        if !entries.is_empty() {
            return Ok(Some(entries));
        }
        found = Some(entries);
    }
    Ok(found)
}

/// Lines are `MAJ:MIN Op value`, and a closing `Total value` that is skipped.
fn parse_blkio(
    path: &Path,
    text: &str,
    names: &mut HashMap<(u64, u64), String>,
) -> Result<Vec<BlkIOEntry>, CgroupError> {
    let bad = |l: &str| CgroupError::Parse {
        path: path.to_path_buf(),
        text: l.to_string(),
    };
    let mut out = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            [] | ["Total", _] => continue,
            [dev, op, value] => {
                let (major, minor) = parse_dev(dev).ok_or_else(|| bad(line))?;
                let value = value.parse().map_err(|_| bad(line))?;
                let device = names
                    .entry((major, minor))
                    .or_insert_with(|| device_name(major, minor))
                    .clone();
                out.push(BlkIOEntry {
                    op: (*op).to_string(),
                    device,
                    major,
                    minor,
                    value,
                    ..Default::default()
                });
            }
            _ => return Err(bad(line)),
        }
    }
    Ok(out)
}

/// `/dev/<name>` of a block device from sysfs, or empty when unknown (containerd leaves it
/// empty too when it cannot name a device).
fn device_name(major: u64, minor: u64) -> String {
    fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/uevent"))
        .ok()
        .and_then(|u| {
            u.lines()
                .find_map(|l| l.strip_prefix("DEVNAME=").map(|n| format!("/dev/{n}")))
        })
        .unwrap_or_default()
}

/// One entry per huge page size (`hugetlb.2MB.usage_in_bytes` ...).
fn hugetlb(dir: &Path) -> Result<Vec<HugetlbStat>, CgroupError> {
    super::hugetlb_sizes(dir, ".usage_in_bytes")
        .into_iter()
        .map(|size| {
            let file = |n: &str| dir.join(format!("hugetlb.{size}.{n}"));
            Ok(HugetlbStat {
                usage: read_u64(&file("usage_in_bytes"), 0)?.unwrap_or(0),
                max: read_u64(&file("max_usage_in_bytes"), 0)?.unwrap_or(0),
                failcnt: read_u64(&file("failcnt"), 0)?.unwrap_or(0),
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

    /// A hybrid-host layout: cpu and cpuacct co-mounted, the rest separate.
    fn fixture(root: &Path) -> V1Paths {
        let cpu = root.join("cpu,cpuacct/c1");
        write(
            &cpu,
            &[
                ("cpuacct.usage", "2500000000\n"),
                ("cpuacct.usage_percpu", "1500000000 1000000000 \n"),
                ("cpuacct.usage_user", "2000000000\n"),
                ("cpuacct.usage_sys", "400000000\n"),
                ("cpuacct.stat", "user 210\nsystem 45\n"),
                (
                    "cpu.stat",
                    "nr_periods 10\nnr_throttled 3\nthrottled_time 7000000\nnr_bursts 0\nburst_time 0\n",
                ),
            ],
        );
        let mem = root.join("memory/c1");
        write(
            &mem,
            &[
                (
                    "memory.stat",
                    "cache 4096\nrss 8192\nrss_huge 0\nshmem 0\nmapped_file 1024\ndirty 12\n\
                     writeback 13\nswap 0\npgpgin 100\npgpgout 50\npgfault 300\npgmajfault 2\n\
                     inactive_anon 11\nactive_anon 8181\ninactive_file 4000\nactive_file 96\n\
                     unevictable 0\nhierarchical_memory_limit 8388608\n\
                     hierarchical_memsw_limit 9223372036854771712\ntotal_cache 4096\n\
                     total_rss 8192\ntotal_rss_huge 0\ntotal_mapped_file 1024\ntotal_dirty 12\n\
                     total_writeback 13\ntotal_pgpgin 100\ntotal_pgpgout 50\ntotal_pgfault 301\n\
                     total_pgmajfault 3\ntotal_inactive_anon 11\ntotal_active_anon 8181\n\
                     total_inactive_file 4000\ntotal_active_file 96\ntotal_unevictable 5\n",
                ),
                ("memory.usage_in_bytes", "12288\n"),
                ("memory.max_usage_in_bytes", "65536\n"),
                ("memory.failcnt", "4\n"),
                ("memory.limit_in_bytes", "8388608\n"),
                ("memory.memsw.usage_in_bytes", "12288\n"),
                ("memory.memsw.max_usage_in_bytes", "65536\n"),
                ("memory.memsw.failcnt", "0\n"),
                ("memory.memsw.limit_in_bytes", "9223372036854771712\n"),
                ("memory.kmem.usage_in_bytes", "777\n"),
                ("memory.kmem.limit_in_bytes", "9223372036854771712\n"),
                ("memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"),
            ],
        );
        let pids = root.join("pids/c1");
        write(&pids, &[("pids.current", "3\n"), ("pids.max", "max\n")]);
        let blkio = root.join("blkio/c1");
        write(
            &blkio,
            &[
                ("blkio.throttle.io_service_bytes_recursive", "Total 0\n"),
                (
                    "blkio.throttle.io_service_bytes",
                    "253:0 Read 4096\n253:0 Write 8192\n253:0 Sync 0\n253:0 Async 12288\n\
                     253:0 Discard 0\n253:0 Total 12288\nTotal 12288\n",
                ),
                (
                    "blkio.throttle.io_serviced_recursive",
                    "253:0 Read 1\n253:0 Write 2\n253:0 Total 3\nTotal 3\n",
                ),
            ],
        );
        let huge = root.join("hugetlb/c1");
        write(
            &huge,
            &[
                ("hugetlb.2MB.usage_in_bytes", "2097152\n"),
                ("hugetlb.2MB.max_usage_in_bytes", "4194304\n"),
                ("hugetlb.2MB.failcnt", "1\n"),
                ("hugetlb.2MB.limit_in_bytes", "9223372036854771712\n"),
                ("hugetlb.1GB.usage_in_bytes", "0\n"),
                ("hugetlb.1GB.rsvd.usage_in_bytes", "0\n"),
            ],
        );
        V1Paths {
            memory: Some(mem),
            cpu: Some(cpu.clone()),
            cpuacct: Some(cpu),
            pids: Some(pids),
            blkio: Some(blkio),
            hugetlb: Some(huge),
        }
    }

    #[test]
    fn maps_every_controller_with_ns_cpu_times() {
        let d = tempfile::tempdir().unwrap();
        let m = v1_metrics(&fixture(d.path())).unwrap();

        let usage = &m.cpu.usage;
        assert_eq!(usage.total, 2_500_000_000);
        assert_eq!(usage.user, 2_000_000_000);
        assert_eq!(usage.kernel, 400_000_000);
        assert_eq!(usage.per_cpu, [1_500_000_000, 1_000_000_000]);
        let t = &m.cpu.throttling;
        assert_eq!((t.periods, t.throttled_periods, t.throttled_time), (10, 3, 7_000_000));

        assert_eq!((m.pids.current, m.pids.limit), (3, 0));

        let mem = &m.memory;
        assert_eq!((mem.cache, mem.rss, mem.mapped_file), (4096, 8192, 1024));
        assert_eq!((mem.dirty, mem.writeback), (12, 13));
        assert_eq!((mem.pg_pg_in, mem.pg_pg_out), (100, 50));
        assert_eq!((mem.pg_fault, mem.pg_maj_fault), (300, 2));
        assert_eq!((mem.total_pg_fault, mem.total_pg_maj_fault), (301, 3));
        assert_eq!(mem.total_inactive_file, 4000);
        assert_eq!(mem.total_unevictable, 5);
        assert_eq!(mem.hierarchical_memory_limit, 8_388_608);
        assert_eq!(mem.hierarchical_swap_limit, 9_223_372_036_854_771_712);
        let u = &mem.usage;
        assert_eq!((u.usage, u.max, u.failcnt, u.limit), (12288, 65536, 4, 8_388_608));
        assert_eq!(mem.swap.limit, 9_223_372_036_854_771_712);
        assert_eq!((mem.kernel.usage, mem.kernel.max), (777, 0));
        assert!(mem.kernel_tcp.is_none());
        assert_eq!(m.memory_oom_control.oom_kill, 2);

        // The recursive throttle file is empty here, so the plain one is used.
        let b = &m.blkio.io_service_bytes_recursive;
        assert_eq!(b.len(), 6);
        assert_eq!(
            (b[0].major, b[0].minor, b[0].op.as_str(), b[0].value),
            (253, 0, "Read", 4096)
        );
        assert_eq!((b[5].op.as_str(), b[5].value), ("Total", 12288));
        let o = &m.blkio.io_serviced_recursive;
        assert_eq!(o.len(), 3);
        assert_eq!((o[1].op.as_str(), o[1].value), ("Write", 2));

        assert_eq!(m.hugetlb.len(), 2);
        let h = m.hugetlb.iter().find(|h| h.pagesize == "2MB").unwrap();
        assert_eq!((h.usage, h.max, h.failcnt), (2_097_152, 4_194_304, 1));
    }

    #[test]
    fn cpuacct_stat_ticks_become_ns_without_the_ns_files() {
        let d = tempfile::tempdir().unwrap();
        let paths = fixture(d.path());
        let cpu = paths.cpuacct.clone().unwrap();
        fs::remove_file(cpu.join("cpuacct.usage_user")).unwrap();
        fs::remove_file(cpu.join("cpuacct.usage_sys")).unwrap();
        let m = v1_metrics(&paths).unwrap();
        let hz = clock_ticks();
        assert_eq!(m.cpu.usage.user, 210 * 1_000_000_000 / hz);
        assert_eq!(m.cpu.usage.kernel, 45 * 1_000_000_000 / hz);
        assert_eq!(ticks_to_ns(210, 100), 2_100_000_000);
        assert_eq!(ticks_to_ns(u64::MAX, 100), u64::MAX);
    }

    #[test]
    fn absent_controllers_leave_sections_unset() {
        let d = tempfile::tempdir().unwrap();
        let mem = d.path().join("memory/c1");
        write(&mem, &[("memory.usage_in_bytes", "1\n")]);
        let paths = V1Paths {
            memory: Some(mem),
            cpuacct: Some(d.path().join("cpuacct/gone")),
            ..Default::default()
        };
        let m = v1_metrics(&paths).unwrap();
        assert!(m.cpu.is_none() && m.pids.is_none() && m.blkio.is_none());
        assert!(m.memory.is_none() && m.memory_oom_control.is_none());
    }

    #[test]
    fn malformed_files_are_errors_not_zeros() {
        let d = tempfile::tempdir().unwrap();
        let paths = fixture(d.path());
        let pids = paths.pids.clone().unwrap();
        fs::write(pids.join("pids.current"), "three\n").unwrap();
        let e = v1_metrics(&paths).unwrap_err();
        assert!(matches!(e, CgroupError::Parse { .. }), "{e}");
        assert!(
            e.to_string().contains("pids.current: unexpected content \"three\""),
            "{e}"
        );
        let blkio = paths.blkio.clone().unwrap();
        let e = parse_blkio(&blkio, "8:x Read 1\n", &mut HashMap::new()).unwrap_err();
        assert!(e.to_string().contains("8:x"), "{e}");
    }

    #[test]
    fn any_carries_the_v1_type_url() {
        let d = tempfile::tempdir().unwrap();
        let cg = ContainerCgroup::v1_at(fixture(d.path()));
        assert!(!cg.is_v2());
        let any = cg.metrics_any().unwrap();
        assert_eq!(any.type_url, "io.containerd.cgroups.v1.Metrics");
        let m = Metrics::parse_from_bytes(&any.value).unwrap();
        assert_eq!(m.cpu.usage.total, 2_500_000_000);
        assert_eq!(cg.oom_kills().unwrap(), 2);
    }
}
