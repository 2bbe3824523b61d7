/**
 * bench:profile-summary — prints what the profiles of a `BENCH_PROFILE=DIR` run of bench:tunnel say, as text:
 * per profiled run (DIR/userpath, DIR/connects) and per process (DIR/<run>/<role>/*.cpuprofile, written by
 * `node --cpu-prof`), the top self-time frames and the rollup by category (bench/lib/profilesummary.ts), clipped to
 * the run's measured window (DIR/<run>/run.json, written by bench/tunnel/profiled.ts); then the CPU of each process
 * over that window from /proc (per GiB, or per connection), beside the measured run's figures for OpenSSH's sshd,
 * ssh and squid.
 *
 *   npx tsx bench/profile-summary.ts DIR [--top N]      (N: 15 by default, at most 100)
 *   npx tsx bench/profile-summary.ts FILE.cpuprofile    (one profile, unclipped)
 */
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { inclusiveByOurFile, summarize, type Summary } from './lib/profilesummary.js';

/** What bench/tunnel/profiled.ts writes beside the profiles of one run. */
export interface RunInfo {
  run: 'userpath' | 'connects';
  what: string;
  fromUs: number;
  toUs: number;
  load: { before: number[]; after: number[] };
  /** GiB received by iperf3 in the window (userpath), or connections made (connects). */
  gib?: number;
  connects?: number;
  connectMsMedian?: number;
  /** CPU seconds of each process over the window, from /proc. */
  cpuSeconds: Record<string, number>;
  /** The measured (unprofiled) run's CPU per GiB or ms per connection, by process, per path: the peer's beside ours. */
  measured: Record<string, Record<string, number>>;
  measuredUnit: string;
}

const pct = (x: number) => `${(x * 100).toFixed(1).padStart(5)}%`;
const ms = (us: number) => `${(us / 1000).toFixed(0).padStart(6)} ms`;

/** One process's summary as lines. */
export function summaryText(label: string, s: Summary, inclusive: Map<string, number>): string[] {
  const busyShare = s.windowUs > 0 ? s.busyUs / s.windowUs : 0;
  const lines = [`  ${label}: ${s.samples} samples, window ${(s.windowUs / 1e6).toFixed(2)} s, main thread busy ${(s.busyUs / 1e6).toFixed(2)} s (${pct(busyShare).trim()})`];
  lines.push('    top self time (share of busy):');
  for (const t of s.top) lines.push(`      ${pct(t.share)} ${ms(t.us)}  ${t.frame}`);
  lines.push('    by category (share of busy; idle: of the window):');
  for (const c of s.categories) if (c.us > 0) lines.push(`      ${pct(c.share)} ${ms(c.us)}  ${c.category}`);
  if (s.ourFiles.length) {
    lines.push('    our code by file, self time (and inclusive: samples with a frame of the file on the stack):');
    for (const f of s.ourFiles) lines.push(`      ${pct(f.share)} ${ms(f.us)}  ${f.file}${inclusive.has(f.file) ? `  (inclusive ${pct(inclusive.get(f.file)! / Math.max(1, s.busyUs)).trim()})` : ''}`);
  }
  return lines;
}

/** The CPU lines of one run: ours over the profiled window, the measured run's per path. */
export function cpuText(info: RunInfo): string[] {
  const per = info.gib ? { d: info.gib, unit: 'CPU s/GiB' } : { d: (info.connects ?? 1) / 1000, unit: 'CPU ms per connection' };
  const row = (r: Record<string, number>) =>
    Object.entries(r)
      .map(([k, v]) => `${k} ${v.toFixed(2)}`)
      .join(', ');
  const ours = Object.fromEntries(Object.entries(info.cpuSeconds).map(([k, v]) => [k, v / per.d]));
  return [
    `  ${per.unit}, profiled window (from /proc; under the profiler): ${row(ours)}`,
    ...Object.entries(info.measured).map(([path, r]) => `  ${info.measuredUnit}, measured run without profiler, ${path}: ${row(r)}`),
  ];
}

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
  if (statSync(target).isFile()) {
    const p: unknown = JSON.parse(readFileSync(target, 'utf8'));
    out.push(...summaryText(target, summarize(p, { top }), inclusiveByOurFile(p)));
  } else {
    const runs = existsSync(join(target, 'run.json')) ? [target] : readdirSync(target).map((r) => join(target, r)).filter((r) => existsSync(join(r, 'run.json')));
    if (!runs.length) throw new Error(`no run.json under ${target}: give the DIR of a BENCH_PROFILE=DIR run`);
    for (const run of runs) {
      const info = JSON.parse(readFileSync(join(run, 'run.json'), 'utf8')) as RunInfo;
      const fmt = (l: number[]) => l.map((n) => n.toFixed(2)).join('/');
      out.push(`${info.run}: ${info.what}; load average ${fmt(info.load.before)} before, ${fmt(info.load.after)} after`);
      out.push(...cpuText(info));
      for (const { role, file } of profilesOf(run)) {
        const p: unknown = JSON.parse(readFileSync(file, 'utf8'));
        const win = { fromUs: info.fromUs, toUs: info.toUs };
        out.push(...summaryText(`${role} (${file.split('/').at(-1)})`, summarize(p, { ...win, top }), inclusiveByOurFile(p, win)));
      }
      out.push('');
    }
  }
  process.stdout.write(`${out.join('\n')}\n`);
}

if (process.argv[1]?.endsWith('profile-summary.ts')) main(process.argv.slice(2));
