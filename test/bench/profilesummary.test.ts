/**
 * bench/lib/profilesummary.ts: a .cpuprofile's self time by frame and by category, clipped to the bench's window,
 * our dist/ files named as their src/ files; damaged or oversized profiles refused, parent cycles walked bounded.
 */
import { describe, expect, it } from 'vitest';
import { categoryOf, inclusiveByOurFile, MAX_NODES, sourceOf, summarize } from '../../bench/lib/profilesummary.js';
import { cpuText, summaryText } from '../../bench/profile-summary.js';

const frame = (functionName: string, url = '', lineNumber = 0) => ({ functionName, url, lineNumber });

/** root -> relay (ours) -> writev (native); root -> idle; root -> gc; root -> Readable.push (streams). */
function profile() {
  return {
    nodes: [
      { id: 1, callFrame: frame('(root)'), children: [2, 4, 5, 6] },
      { id: 2, callFrame: frame('relay', 'file:///work/x/dist/tunnel/e2e.js', 9), children: [3] },
      { id: 3, callFrame: frame('writev') },
      { id: 4, callFrame: frame('(idle)') },
      { id: 5, callFrame: frame('(garbage collector)') },
      { id: 6, callFrame: frame('Readable.push', 'node:internal/streams/readable', 199) },
    ],
    startTime: 1000,
    endTime: 2000,
    // sample i lasts timeDeltas[i + 1]: t=1010 writev 100, 1110 relay 100, 1210 idle 300, 1510 gc 100, 1610 push 100, 1710 writev 0
    samples: [3, 2, 4, 5, 6, 3],
    timeDeltas: [10, 100, 100, 300, 100, 100],
  };
}

describe('profile summary', () => {
  it('splits self time by frame and category, idle apart', () => {
    const s = summarize(profile());
    expect(s.windowUs).toBe(700);
    expect(s.busyUs).toBe(400);
    expect(s.top.map((t) => t.frame)).toEqual(['writev (native)', 'relay (src/tunnel/e2e.ts:10)', '(garbage collector) (native)', 'Readable.push (internal/streams/readable:200)']);
    const cat = Object.fromEntries(s.categories.map((c) => [c.category, c.us]));
    expect(cat.idle).toBe(300);
    expect(cat['socket writes, native (TLS encryption + write(2))']).toBe(100);
    expect(cat['stream plumbing (node:internal/streams)']).toBe(100);
    expect(cat['our code (src/)']).toBe(100);
    expect(s.ourFiles).toEqual([{ file: 'src/tunnel/e2e.ts', us: 100, share: 0.25 }]);
    expect(s.top[0]!.via).toBe('relay (src/tunnel/e2e.ts:10) 100%'); // who made the native write
    expect(s.top[1]!.via).toBeUndefined(); // a frame of ours is not its own caller
  });

  it('keeps only the samples inside the window', () => {
    const s = summarize(profile(), { fromUs: 1100, toUs: 1600 });
    expect(s.samples).toBe(3); // relay, idle, gc
    expect(s.busyUs).toBe(200);
    expect(s.top.map((t) => t.frame)).not.toContain('writev (native)');
  });

  it('counts a file inclusively when it is anywhere on the stack', () => {
    expect(inclusiveByOurFile(profile()).get('src/tunnel/e2e.ts')).toBe(200); // relay itself and the writev under it
  });

  it('names sources and categories', () => {
    expect(sourceOf('file:///a/node_modules/@scope/pkg/x.js')).toEqual({ kind: 'dep', name: '@scope/pkg' });
    expect(sourceOf('file:///a/dist/cli/gwsh.js')).toEqual({ kind: 'ours', name: 'src/cli/gwsh.ts' });
    expect(categoryOf(frame('TLSSocket._start', 'node:_tls_wrap'))).toBe('crypto and TLS, node JS (node:_tls_*, node:internal/crypto)');
    expect(categoryOf(frame('sign'))).toBe('crypto and TLS, other native');
    expect(categoryOf(frame('(program)'))).toMatch(/^native outside JS/);
  });

  it('prints bounded text', () => {
    const s = summarize(profile(), { top: 2 });
    expect(s.top).toHaveLength(2);
    const text = summaryText('gwsh', s, inclusiveByOurFile(profile())).join('\n');
    expect(text).toContain('gwsh: 6 samples');
    expect(text).toContain('src/tunnel/e2e.ts  (inclusive 50.0%)');
    const split = (user: number, sys: number, main: number) => ({ user, sys, mainUser: main, mainSys: 0 });
    const cpu = cpuText({
      run: 'userpath', what: 'iperf3', fromUs: 0, toUs: 1, load: { before: [], after: [] }, gib: 2, cpu: { gwsh: split(1, 2, 1.5) },
      peer: { what: 'ssh', gib: 1, cpu: { sshd: split(1, 1, 2) } }, measured: { ssh: { sshd: 1 } }, measuredUnit: 'CPU s/GiB',
    });
    expect(cpu[0]).toContain('gwsh 1.50 (user 0.50, system 1.00; main thread 50%)');
    expect(cpu[1]).toContain('sshd 2.00 (user 1.00, system 1.00)'); // one thread: no main-thread share
    expect(cpu[2]).toContain('measured run without profiler, ssh: sshd 1.00');
    const paced = cpuText({ run: 'connects', what: 'c', fromUs: 0, toUs: 1, load: { before: [], after: [] }, connects: 10, connectMsMedian: 5, cpu: {}, paced: { gateway: 12, openssh: 1.3, pauseMs: 100, count: 50 }, measured: {}, measuredUnit: 'CPU ms per connection' });
    expect(paced[1]).toBe('  paced: 50 new connections per path, taking turns, 100 ms after each: median gateway 12.00 ms, OpenSSH 1.30 ms');
  });

  it('says how many pieces each process moved a GiB in, and how the measured runs were taken', () => {
    const split = { user: 1, sys: 1, mainUser: 2, mainSys: 0 };
    const io = { A: { reads: 32_000, writes: 16_000, readBytes: 32_000 * 32 * 1024, writeBytes: 16_000 * 64 * 1024 }, gone: { reads: 0, writes: 0, readBytes: 0, writeBytes: 0 } };
    const text = cpuText({ run: 'e2e-peered', roles: ['A'], what: 'w', fromUs: 0, toUs: 1, load: { before: [], after: [] }, gib: 2, cpu: { A: split }, io, measured: { peered: { A: 1.5 } }, measuredUnit: 'CPU s/GiB', measuredHow: 'measured runs, daemons under the profiler' });
    expect(text[0]).toContain('\n  syscalls per GiB (read(2)/write(2) families, /proc/<pid>/io; mean size): A 16.0k reads of 32.0 KiB, 8.0k writes of 64.0 KiB; gone 0.0k reads of - KiB, 0.0k writes of - KiB');
    expect(text[1]).toBe('  CPU s/GiB, measured runs, daemons under the profiler, peered: A 1.50');
  });

  it('refuses what is not a profile, a damaged one, and one past the bounds', () => {
    expect(() => summarize({ nodes: 'x' })).toThrow(/not a .cpuprofile/);
    expect(() => summarize({ ...profile(), timeDeltas: [1] })).toThrow(/damaged/);
    expect(() => summarize({ ...profile(), samples: [3, 2, 4, 5, 6, 99] })).toThrow(/node 99/);
    expect(() => summarize({ ...profile(), nodes: { length: MAX_NODES + 1 } as unknown as [] })).toThrow(/not a .cpuprofile/);
    const big = { ...profile(), nodes: new Array(MAX_NODES + 1).fill(profile().nodes[0]) };
    expect(() => summarize(big)).toThrow(/too large/);
  });

  it('walks a cycle of parents a bounded number of steps', () => {
    const p = profile();
    p.nodes[0]!.children = [2];
    p.nodes[2] = { id: 3, callFrame: frame('writev'), children: [1] } as (typeof p.nodes)[number]; // 1 -> 2 -> 3 -> 1
    p.nodes[1]!.children = [3];
    expect(inclusiveByOurFile({ ...p, samples: [3, 3], timeDeltas: [1, 1] }).get('src/tunnel/e2e.ts')).toBe(1);
  });
});
