/** The one shutdown order of a process (src/roles/lifecycle.ts), with closers that only write to a log. */
import { describe, expect, it } from 'vitest';
import { Lifecycle, STOP_ORDER, type StopPhase } from '../../src/roles/lifecycle.js';

/** A closer that logs its start, lets the event loop turn (so others could overtake it), then logs its end. */
function slowCloser(log: string[], name: string): () => Promise<void> {
  return async () => {
    log.push(`${name} start`);
    await new Promise((r) => setImmediate(r));
    await new Promise((r) => setImmediate(r));
    log.push(`${name} end`);
  };
}

describe('Lifecycle', () => {
  it('runs the phases in order (agents, proxy, auth, backend), whatever order they were registered in', async () => {
    const lifecycle = new Lifecycle();
    const log: string[] = [];
    for (const phase of [...STOP_ORDER].reverse()) lifecycle.onStop(phase, slowCloser(log, phase));
    await lifecycle.stop();
    expect(log).toEqual(['agents', 'proxy', 'auth', 'backend'].flatMap((p) => [`${p} start`, `${p} end`]));
  });

  it('closes one phase concurrently, and starts the next only when all of it has ended', async () => {
    const lifecycle = new Lifecycle();
    const log: string[] = [];
    lifecycle.onStop('proxy', slowCloser(log, 'tunnels'));
    lifecycle.onStop('proxy', slowCloser(log, 'listeners'));
    lifecycle.onStop('auth', slowCloser(log, 'auth API'));
    await lifecycle.stop();
    expect(log.slice(0, 2).sort()).toEqual(['listeners start', 'tunnels start']);
    expect(log.slice(2, 4).sort()).toEqual(['listeners end', 'tunnels end']);
    expect(log.slice(4)).toEqual(['auth API start', 'auth API end']);
  });

  it('a failing closer does not keep the later phases from closing; stop() then rejects with the first failure', async () => {
    const lifecycle = new Lifecycle();
    const closed: StopPhase[] = [];
    lifecycle.onStop('agents', () => {
      throw new Error('agent stop failed');
    });
    lifecycle.onStop('proxy', async () => {
      throw new Error('second failure');
    });
    for (const phase of STOP_ORDER) lifecycle.onStop(phase, () => void closed.push(phase));
    await expect(lifecycle.stop()).rejects.toThrow('agent stop failed');
    expect(closed).toEqual([...STOP_ORDER]);
  });

  it('stops once: a second stop() is the same shutdown, and nothing may be registered after it', async () => {
    const lifecycle = new Lifecycle();
    let runs = 0;
    lifecycle.onStop('backend', () => void runs++);
    const first = lifecycle.stop();
    expect(lifecycle.stop()).toBe(first);
    await first;
    expect(runs).toBe(1);
    expect(() => lifecycle.onStop('agents', () => undefined)).toThrow(/after stop/);
  });
});
