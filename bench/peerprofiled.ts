/**
 * BENCH_PROFILE=DIR for bench:peer (real daemons; the same convention as bench:tunnel's, bench/tunnel/profiled.ts):
 * B, each A and the agent run as `node --cpu-prof --cpu-prof-dir DIR/procs/<role>` for the whole bench (so its
 * measured figures carry the sampler's cost too: compare runs with and without it, not across). After the measured
 * runs, one profiled window per end-to-end path, taking turns:
 *
 *   e2e-direct   client -> B (splices onto the agent's data connection) -> agent -> sink
 *   e2e-peered   client -> A (forwards raw to B's peering listener) -> B (splices) -> agent -> sink
 *
 * each BENCH_PROFILE_PUSHES streams of BENCH_MIB MiB back to back, timed with process.hrtime (the profiles' clock:
 * CLOCK_MONOTONIC in every process) and with each process's user and system CPU and its read and write syscalls
 * (how many pieces it moved the bytes in) over it (/proc), into
 * DIR/<run>/run.json. When the daemons have stopped (SIGTERM: each writes its profile as it exits), every profile is
 * linked into each run's directory, DIR/<run>/<role>/, where bench/profile-summary.ts clips it to that run's window.
 */
import { existsSync, linkSync, mkdirSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { loadavg } from 'node:os';
import { join, resolve } from 'node:path';
import { cpuSplit, ioDelta, splitDelta, syscallIo } from './lib/proc.js';
import type { RunInfo } from './profile-summary.js';

const RAW = process.env.BENCH_PROFILE?.trim() ?? '';
/** The directory of a BENCH_PROFILE=DIR run, or undefined (profiling off). */
export const PROFILE_ROOT = RAW && !/^\d+$/.test(RAW) ? resolve(RAW) : undefined;
const PUSHES = Math.max(1, Number(process.env.BENCH_PROFILE_PUSHES ?? 3) || 3);

/** BENCH_DAEMON_NODE_ARGS: node's options for every daemon, space-separated (e.g. V8's --initial-old-space-size=64). */
const DAEMON_NODE_ARGS = (process.env.BENCH_DAEMON_NODE_ARGS ?? '').split(' ').filter((a) => a !== '');

/** node's own options for a daemon of the given role: BENCH_DAEMON_NODE_ARGS, and --cpu-prof into DIR/procs/<role> when profiling. */
export function profileArgs(role: string): string[] {
  return [...DAEMON_NODE_ARGS, ...(PROFILE_ROOT ? ['--cpu-prof', '--cpu-prof-dir', join(PROFILE_ROOT, 'procs', role)] : [])];
}

export interface ProfiledPath {
  run: 'e2e-direct' | 'e2e-peered';
  name: string;
  /** One stream of mib MiB pushed to the sink through the path; its MiB/s. */
  push(): Promise<number>;
  /** The measured (unprofiled-window) runs' CPU seconds per GiB by process. */
  measured: Record<string, number>;
}

const hrUs = () => Number(process.hrtime.bigint() / 1000n);

/** The windows, taking turns, each into DIR/<run>/run.json; roles: the daemons' directory names, pids: by label. */
export async function profiledWindows(paths: ProfiledPath[], mib: number, pids: Record<string, number>, roles: string[], say: (s: string) => void): Promise<void> {
  if (!PROFILE_ROOT) return;
  const procs = { ...pids, 'bench (client, sink)': process.pid };
  for (const p of paths) {
    await p.push(); // warm-up
    const dir = join(PROFILE_ROOT, p.run);
    mkdirSync(dir, { recursive: true });
    const load0 = loadavg();
    const before = Object.fromEntries(Object.entries(procs).map(([k, pid]) => [k, cpuSplit([pid])]));
    const ioBefore = Object.fromEntries(Object.entries(procs).map(([k, pid]) => [k, syscallIo(pid)]));
    const rates: number[] = [];
    const fromUs = hrUs();
    for (let i = 0; i < PUSHES; i++) rates.push(await p.push());
    const toUs = hrUs();
    const cpu = Object.fromEntries(Object.entries(procs).map(([k, pid]) => [k, splitDelta(before[k]!, cpuSplit([pid]))]));
    const io = Object.fromEntries(Object.entries(procs).map(([k, pid]) => [k, ioDelta(ioBefore[k]!, syscallIo(pid))]));
    const sorted = [...rates].sort((a, b) => a - b);
    const info: RunInfo = {
      run: p.run,
      roles,
      what: `${PUSHES} streams of ${mib} MiB back to back through ${p.name}, median ${sorted[Math.floor(sorted.length / 2)]!.toFixed(0)} MiB/s (${rates.map((r) => r.toFixed(0)).join(', ')})`,
      gib: (PUSHES * mib) / 1024,
      cpu,
      io,
      fromUs,
      toUs,
      load: { before: load0, after: loadavg() },
      measured: { [p.name.split(' (')[0]!]: p.measured },
      measuredUnit: 'CPU s/GiB',
      measuredHow: 'measured runs before it (paths interleaved, the daemons under the profiler too)',
    };
    writeFileSync(join(dir, 'run.json'), JSON.stringify(info, null, 1));
    say(`profiled ${p.run}: ${info.what}`);
  }
}

/** After the daemons exited: each profile of DIR/procs/<role>/ linked into DIR/<run>/<role>/ for every run. */
export function linkProfiles(say: (s: string) => void): void {
  if (!PROFILE_ROOT) return;
  const procs = join(PROFILE_ROOT, 'procs');
  if (!existsSync(procs)) return;
  const runs = readdirSync(PROFILE_ROOT).filter((r) => existsSync(join(PROFILE_ROOT!, r, 'run.json')));
  for (const role of readdirSync(procs)) {
    for (const f of readdirSync(join(procs, role)).filter((x) => x.endsWith('.cpuprofile'))) {
      for (const run of runs) {
        mkdirSync(join(PROFILE_ROOT, run, role), { recursive: true });
        linkSync(join(procs, role, f), join(PROFILE_ROOT, run, role, f));
      }
    }
  }
  rmSync(procs, { recursive: true, force: true });
  say(`profiles in ${PROFILE_ROOT}: npm run -s bench:profile-summary -- ${PROFILE_ROOT}`);
}
