/**
 * bench:profile-summary — prints what the profiles of a `BENCH_PROFILE=DIR` run of bench:tunnel (or of bench:peer:
 * DIR/e2e-direct, DIR/e2e-peered, with the processes A, B and agent: bench/peerprofiled.ts) say, as text:
 * per profiled run (DIR/userpath, DIR/connects, DIR/roundtrips) and per process (DIR/<run>/<role>/*.cpuprofile, written by
 * `node --cpu-prof`), the top self-time frames and the rollup by category (bench/lib/profilesummary.ts), clipped to
 * the run's measured window (DIR/<run>/run.json, written by bench/tunnel/profiled.ts); and the user and system CPU
 * of each process over that window from /proc (per GiB, per connection or per round trip; the main thread's share),
 * beside the same for OpenSSH's sshd, ssh + socat and squid doing the same work right after, and the measured run's
 * figures. A profile's "busy" is wall time of the main thread outside (idle), waiting for a core included: /proc's
 * figures are the CPU.
 *
 *   npx tsx bench/profile-summary.ts DIR [--top N]      (N: 15 by default, at most 100)
 *   npx tsx bench/profile-summary.ts FILE.cpuprofile    (one profile, unclipped)
 */
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { SourceMap } from 'node:module';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { CpuSplit, SyscallIo } from './lib/proc.js';
import { inclusiveByOurFile, summarize, type Resolve, type Summary } from './lib/profilesummary.js';

/** One path's window: what ran, and the user / system CPU seconds of each process over it (bench/lib/proc.ts). */
export interface PathWindow {
  what: string;
  /** GiB received by iperf3 in the window (userpath), or connections made (connects) or round trips (roundtrips). */
  gib?: number;
  connects?: number;
  connectMsMedian?: number;
  cpu: Record<string, CpuSplit>;
  /** The read and write syscalls of each process over the window (bench:peer's windows record them). */
  io?: Record<string, SyscallIo>;
}

/** What bench/tunnel/profiled.ts writes beside the profiles of one run: our path's window (profiled), OpenSSH's. */
export interface RunInfo extends PathWindow {
  /** bench:tunnel's runs (bench/tunnel/profiled.ts), or bench:peer's end-to-end throughput windows (bench/peerprofiled.ts). */
  run: 'userpath' | 'connects' | 'roundtrips' | 'e2e-direct' | 'e2e-peered';
  /** The processes profiled, by their directory's name (default: bench:tunnel's agent, gwsh and proxy). */
  roles?: string[];
  fromUs: number;
  toUs: number;
  load: { before: number[]; after: number[] };
  /** The same work through OpenSSH's ssh -R forward, right after (not profiled). */
  peer?: PathWindow;
  /** connects: medians (ms) of new connections taken in turns with a pause after each, both paths. */
  paced?: { gateway: number; openssh: number; pauseMs: number; count: number };
  /** The measured (unprofiled) run's CPU per GiB or ms per connection, by process, per path. */
  measured: Record<string, Record<string, number>>;
  /** How the measured runs were taken, when not as bench:tunnel's (without the profiler). */
  measuredHow?: string;
  measuredUnit: string;
}

const pct = (x: number) => `${(x * 100).toFixed(1).padStart(5)}%`;
const ms = (us: number) => `${(us / 1000).toFixed(0).padStart(6)} ms`;

/** One process's summary as lines. */
export function summaryText(label: string, s: Summary, inclusive: Map<string, number>): string[] {
  const busyShare = s.windowUs > 0 ? s.busyUs / s.windowUs : 0;
  const lines = [`  ${label}: ${s.samples} samples, window ${(s.windowUs / 1e6).toFixed(2)} s, main thread busy (wall time outside idle) ${(s.busyUs / 1e6).toFixed(2)} s (${pct(busyShare).trim()})`];
  lines.push('    top self time (share of busy):');
  for (const t of s.top) lines.push(`      ${pct(t.share)} ${ms(t.us)}  ${t.frame}${t.via ? `  <- ${t.via}` : ''}`);
  lines.push('    by category (share of busy; idle: of the window):');
  for (const c of s.categories) if (c.us > 0) lines.push(`      ${pct(c.share)} ${ms(c.us)}  ${c.category}`);
  if (s.ourFiles.length) {
    lines.push('    our code by file, self time (and inclusive: samples with a frame of the file on the stack):');
    for (const f of s.ourFiles) lines.push(`      ${pct(f.share)} ${ms(f.us)}  ${f.file}${inclusive.has(f.file) ? `  (inclusive ${pct(inclusive.get(f.file)! / Math.max(1, s.busyUs)).trim()})` : ''}`);
  }
  return lines;
}

/** The CPU lines of one path's window: per GiB, connection or round trip; user / system; the main thread's share. */
export function windowText(label: string, w: PathWindow): string {
  const per = w.gib ? { d: w.gib, unit: 'CPU s/GiB' } : { d: (w.connects ?? 1) / 1000, unit: w.connectMsMedian !== undefined ? 'CPU ms per connection' : 'CPU ms per round trip' };
  const each = Object.entries(w.cpu).map(([k, c]) => {
    const total = c.user + c.sys;
    const main = total > 0 ? ` (user ${(c.user / per.d).toFixed(2)}, system ${(c.sys / per.d).toFixed(2)}${c.mainUser + c.mainSys < total - 1e-9 ? `; main thread ${(((c.mainUser + c.mainSys) / total) * 100).toFixed(0)}%` : ''})` : '';
    return `${k} ${(total / per.d).toFixed(2)}${main}`;
  });
  const sum = Object.values(w.cpu).reduce((a, c) => a + c.user + c.sys, 0) / per.d;
  const line = `  ${label}: ${w.what}. ${per.unit}: ${each.join(', ')}; all ${sum.toFixed(2)}`;
  return w.io ? `${line}\n${ioText(w.io, per)}` : line;
}

/** Syscalls per unit and their mean size: how many pieces each process moved the bytes in. */
function ioText(io: Record<string, SyscallIo>, per: { d: number; unit: string }): string {
  const kib = (bytes: number, n: number) => (n > 0 ? (bytes / n / 1024).toFixed(1) : '-');
  const each = Object.entries(io).map(([k, v]) => `${k} ${(v.reads / per.d / 1000).toFixed(1)}k reads of ${kib(v.readBytes, v.reads)} KiB, ${(v.writes / per.d / 1000).toFixed(1)}k writes of ${kib(v.writeBytes, v.writes)} KiB`);
  const unit = per.unit === 'CPU s/GiB' ? 'GiB' : per.unit.replace(/^CPU ms per /, '');
  return `  syscalls per ${unit} (read(2)/write(2) families, /proc/<pid>/io; mean size): ${each.join('; ')}`;
}

/** The CPU lines of one run: ours over the profiled window, OpenSSH's right after, the measured run's per path. */
export function cpuText(info: RunInfo): string[] {
  const row = (r: Record<string, number>) =>
    Object.entries(r)
      .map(([k, v]) => `${k} ${v.toFixed(2)}`)
      .join(', ');
  return [
    windowText('gateway, profiled', info),
    ...(info.peer ? [windowText('OpenSSH, same work right after (not profiled)', info.peer)] : []),
    ...(info.paced ? [`  paced: ${info.paced.count} new connections per path, taking turns, ${info.paced.pauseMs} ms after each: median gateway ${info.paced.gateway.toFixed(2)} ms, OpenSSH ${info.paced.openssh.toFixed(2)} ms`] : []),
    ...Object.entries(info.measured).map(([path, r]) => `  ${info.measuredUnit}, ${info.measuredHow ?? 'measured run without profiler'}, ${path}: ${row(r)}`),
  ];
}

/**
 * Positions in our bundles (dist/cli/bundle-*.js) back to src/ files, from the .map file beside each bundle (read
 * once per bundle; a bundle without one stays as it is).
 */
export function sourceMapResolver(): Resolve {
  const maps = new Map<string, SourceMap | undefined>();
  return (url, line, column) => {
    if (!maps.has(url)) {
      let map: SourceMap | undefined;
      try {
        const file = url.startsWith('file:') ? fileURLToPath(url) : url;
        if (existsSync(`${file}.map`)) map = new SourceMap(JSON.parse(readFileSync(`${file}.map`, 'utf8')) as ConstructorParameters<typeof SourceMap>[0]);
      } catch {
        map = undefined; // not ours, or a damaged map: the bundle's own position is kept
      }
      maps.set(url, map);
    }
    const e = maps.get(url)?.findEntry(line, column) as { originalSource?: string; originalLine?: number } | undefined;
    return e?.originalSource ? { url: e.originalSource, line: e.originalLine ?? 0 } : undefined;
  };
}

/** The processes bench/tunnel/profiled.ts starts under the profiler, by their directory's name (run.json may say others). */
const ROLES = ['agent', 'gwsh', 'proxy'];

/** The .cpuprofile files under dir/<role>/, by role. */
function profilesOf(dir: string): Array<{ role: string; file: string }> {
  const out: Array<{ role: string; file: string }> = [];
  for (const role of readdirSync(dir).sort()) {
    const d = join(dir, role);
    if (!statSync(d).isDirectory()) continue;
    for (const f of readdirSync(d).filter((x) => x.endsWith('.cpuprofile')).sort()) out.push({ role, file: join(d, f) });
  }
  return out;
}

function main(argv: string[]): void {
  const target = argv.find((a) => !a.startsWith('--'));
  const topArg = argv.indexOf('--top');
  const top = topArg >= 0 ? Number(argv[topArg + 1]) : 15;
  if (!target || !existsSync(target) || !Number.isInteger(top) || top < 1) {
    process.stderr.write('usage: npx tsx bench/profile-summary.ts DIR|FILE.cpuprofile [--top N]\n');
    process.exit(2);
  }
  const out: string[] = [];
  const resolve = sourceMapResolver();
  if (statSync(target).isFile()) {
    const p: unknown = JSON.parse(readFileSync(target, 'utf8'));
    out.push(...summaryText(target, summarize(p, { top, resolve }), inclusiveByOurFile(p, { resolve })));
  } else {
    const runs = existsSync(join(target, 'run.json')) ? [target] : readdirSync(target).map((r) => join(target, r)).filter((r) => existsSync(join(r, 'run.json')));
    if (!runs.length) throw new Error(`no run.json under ${target}: give the DIR of a BENCH_PROFILE=DIR run`);
    for (const run of runs) {
      const info = JSON.parse(readFileSync(join(run, 'run.json'), 'utf8')) as RunInfo;
      const fmt = (l: number[]) => l.map((n) => n.toFixed(2)).join('/');
      out.push(`${info.run}: ${info.what}; load average ${fmt(info.load.before)} before, ${fmt(info.load.after)} after`);
      out.push(...cpuText(info));
      const profiles = profilesOf(run);
      for (const role of info.roles ?? ROLES) if (!profiles.some((p) => p.role === role)) out.push(`  ${role}: no profile (node --cpu-prof writes it when the process exits; this one did not exit by itself)`);
      for (const { role, file } of profiles) {
        const p: unknown = JSON.parse(readFileSync(file, 'utf8'));
        const win = { fromUs: info.fromUs, toUs: info.toUs, resolve };
        out.push(...summaryText(`${role} (${file.split('/').at(-1)})`, summarize(p, { ...win, top }), inclusiveByOurFile(p, win)));
      }
      out.push('');
    }
  }
  process.stdout.write(`${out.join('\n')}\n`);
}

if (process.argv[1]?.endsWith('profile-summary.ts')) main(process.argv.slice(2));
