/**
 * The agent's data connections behind a load balancer (src/agent/e2edata.ts), with a fake Dialer: each dial lands
 * on one of several fake Proxies that a "balancer" function picks, each Proxy checking the preamble's pair of its
 * own tunnel key and answering as src/proxy/e2edata.ts does. The real Proxies behind a real HAProxy:
 * test/e2e/ha.test.ts.
 */
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import type { Duplex } from 'node:stream';
import { afterEach, describe, expect, it } from 'vitest';
import { DataPools, type DataTunnelHandle, type DataTunnelSpec } from '../../src/agent/e2edata.js';
import { logger } from '../../src/log.js';
import { duplexPair } from '../../src/stream/pair.js';
import { checkDataPreamble, dataAnswer, DATA_TUNNELS_MAX, parseDataPreamble } from '../../src/tunnel/e2e.js';
import { waitUntil } from '../helpers/wait.js';

interface FakeProxy {
  id: string;
  key: Buffer;
  /** Connections it admitted, by number (the Proxy's side). */
  conns: Map<number, Duplex>;
  /** Answer `no` with this reason instead of admitting. */
  refuse?: string;
  /** Bytes written with the answer, in the same chunk (a client's ClientHello right behind it). */
  after?: Buffer;
  /** Answer this instead (a hostile or broken Proxy), or nothing at all. */
  lie?: Buffer | 'silent';
  /** Hold the answer until this resolves (an e2e-open that overtakes it). */
  hold?: Promise<void>;
  /** Numbers it saw (each one's pairs checked). */
  seen: number[];
}

function fakeProxy(id: string): FakeProxy {
  return { id, key: randomBytes(32), conns: new Map(), seen: [] };
}

/** The Proxy's side of a data connection: the preamble, its own pair checked, the answer. */
function serve(proxy: FakeProxy, side: Duplex): void {
  let buf = Buffer.alloc(0);
  const onData = (chunk: Buffer) => {
    buf = Buffer.concat([buf, chunk]);
    const p = parseDataPreamble(buf);
    if (p.kind === 'need-more') return;
    side.off('data', onData);
    if (p.kind !== 'ok' || !checkDataPreamble(proxy.key, p)) return void side.end(dataAnswer({ ok: false, reason: 'unknown-tunnel' }));
    proxy.seen.push(p.n);
    const answer = () => {
      if (proxy.lie === 'silent') return;
      if (proxy.lie) return void side.write(proxy.lie);
      if (proxy.refuse) return void side.end(dataAnswer({ ok: false, reason: proxy.refuse }));
      side.write(Buffer.concat([dataAnswer({ ok: true, proxy: proxy.id }), proxy.after ?? Buffer.alloc(0)]));
      proxy.conns.set(p.n, side);
      side.once('close', () => proxy.conns.delete(p.n));
    };
    if (proxy.hold) void proxy.hold.then(answer);
    else answer();
  };
  side.on('data', onData);
  side.on('error', () => undefined);
}

interface Balancer {
  dialer: DataTunnelSpec['dialer'];
  dials: string[];
}

/** A Dialer whose connections are in-memory pairs (the pool uses a Duplex only). */
function fakeDialer(dial: (addr: string) => Duplex): DataTunnelSpec['dialer'] {
  return { dial: async (addr: unknown) => dial(String(addr)) } as unknown as DataTunnelSpec['dialer'];
}

/** Dials land where `pick` says (by the dial's index). */
function balancer(proxies: FakeProxy[], pick: (i: number) => number): Balancer {
  const dials: string[] = [];
  return {
    dials,
    dialer: fakeDialer((addr) => {
      const [agentSide, proxySide] = duplexPair();
      const proxy = proxies[pick(dials.length) % proxies.length]!;
      dials.push(`${addr}>${proxy.id}`);
      serve(proxy, proxySide);
      return agentSide;
    }),
  };
}

/** A seeded sequence (xorshift): "random" landings the test can repeat. */
function seeded(seed: number): (i: number) => number {
  let x = seed;
  return () => {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    return Math.abs(x);
  };
}

const handles: DataTunnelHandle[] = [];
afterEach(() => {
  for (const h of handles.splice(0)) h.detach();
});

function attach(pools: DataPools, b: Balancer, proxy: FakeProxy, extra: Partial<DataTunnelSpec> = {}): DataTunnelHandle {
  const h = pools.attach({ dialer: b.dialer, addr: 'lb.example:443', proxyId: proxy.id, key: proxy.key, size: 2, log: logger('test'), backoff: { firstMs: 20, maxMs: 50 }, ...extra });
  handles.push(h);
  return h;
}

/** Lets every pending dial, answer and refill run (the fake dialer and duplexPair settle within a few turns). */
async function settled(): Promise<void> {
  for (let i = 0; i < 20; i++) await new Promise((r) => setImmediate(r));
}

describe('data connections through one address to several Proxies', () => {
  it('fills every Proxy to its size wherever the balancer sends them, keeps spares within the bound, then stops dialling', async () => {
    const delays: number[] = [];
    const backoffDeps = { setTimer: (fn: () => void, ms: number) => (delays.push(ms), setTimeout(fn, ms)), clearTimer: (h: unknown) => clearTimeout(h as NodeJS.Timeout) };
    const proxies = ['p-a', 'p-b', 'p-c'].map(fakeProxy);
    const b = balancer(proxies, seeded(7));
    const pools = new DataPools();
    const hs = proxies.map((p) => attach(pools, b, p, { backoffDeps }));
    await waitUntil('every Proxy holds 2', () => proxies.every((p) => p.conns.size >= 2));
    await settled();
    const pool = pools.poolOf('lb.example:443')!;
    // What the agent believes is what each Proxy holds.
    for (const [i, p] of proxies.entries()) expect(hs[i]!.numbers.sort()).toEqual([...p.conns.keys()].sort());
    expect(pool.spares).toBeLessThanOrEqual(2);
    const total = proxies.reduce((n, p) => n + p.conns.size, 0);
    expect(total).toBeLessThanOrEqual(3 * 2 + 2);
    // Every dial was kept but for the spares closed to make room, each after a backoff; then no more come.
    expect(b.dials.length - total).toBeLessThanOrEqual(delays.length);
    const dials = b.dials.length;
    await settled();
    expect(b.dials.length).toBe(dials);
    // One counter for the agent: every number is new, whichever Proxy saw it.
    const seen = proxies.flatMap((p) => p.seen);
    expect(new Set(seen).size).toBe(seen.length);
  });

  it('a balancer that always picks one Proxy: that Proxy gets its size and the spares, then each dial waits for the backoff', async () => {
    const delays: number[] = [];
    const backoffDeps = { setTimer: (fn: () => void, ms: number) => (delays.push(ms), setTimeout(fn, ms)), clearTimer: (h: unknown) => clearTimeout(h as NodeJS.Timeout) };
    const proxies = ['p-a', 'p-b', 'p-c'].map(fakeProxy);
    const b = balancer(proxies, () => 0);
    const pools = new DataPools();
    for (const p of proxies) attach(pools, b, p, { backoffDeps });
    await waitUntil('p-a holds 4', () => proxies[0]!.conns.size === 4);
    await waitUntil('three spares recycled', () => b.dials.length >= 7);
    // The first four at once; every dial after them (an old spare closed for it) waited for the backoff.
    expect(delays.length).toBeGreaterThanOrEqual(b.dials.length - 4);
    expect(delays.every((d) => d >= 10 && d <= 50)).toBe(true);
    expect(pools.poolOf('lb.example:443')!.spares).toBeLessThanOrEqual(2);
    expect(proxies[0]!.conns.size).toBeLessThanOrEqual(4);
    expect(proxies[1]!.conns.size + proxies[2]!.conns.size).toBe(0);
  });

  it('closing spares slows down while dials keep landing at the same Proxy, and starts again at the first pace once one lands where one was missing', async () => {
    const delays: Array<{ ms: number; dials: number }> = [];
    const proxies = ['p-a', 'p-b', 'p-c'].map(fakeProxy);
    const b = balancer(proxies, (i) => (i < 7 || i === 8 ? 0 : i % 2 ? 1 : 2));
    const backoffDeps = { setTimer: (fn: () => void, ms: number) => (delays.push({ ms, dials: b.dials.length }), setTimeout(fn, ms)), clearTimer: (h: unknown) => clearTimeout(h as NodeJS.Timeout) };
    const pools = new DataPools();
    for (const p of proxies) attach(pools, b, p, { backoffDeps, backoff: { firstMs: 20, maxMs: 2_000 } });
    await waitUntil('every Proxy holds 2', () => proxies.every((p) => p.conns.size >= 2), 20_000);
    // Dials 1-4 at once, then one spare closed before each of dials 5-8, each wait longer (equal jitter: at least
    // half of 20, 40, 80, 160 ms); dial 8 lands at p-b, where one was missing, so dial 9 follows at once (a spare
    // fewer) and lands at p-a again: the wait before dial 10 is at the first pace.
    const before = delays.filter((d) => d.dials <= 7);
    expect(before.map((d) => d.dials)).toEqual([4, 5, 6, 7]);
    expect(before[3]!.ms).toBeGreaterThanOrEqual(80);
    expect(delays.find((d) => d.dials === 8)).toBeUndefined();
    expect(delays.find((d) => d.dials === 9)!.ms).toBeLessThanOrEqual(20);
  });

  it('a Proxy that joins puts the closing of spares back at the first pace, whatever pace the balancer had driven it to', async () => {
    // Timers the test fires itself: which ones the pool schedules and cancels is what is checked, not how long they take.
    const timers: Array<{ fn: () => void; ms: number; cleared: boolean }> = [];
    const backoffDeps = {
      setTimer: (fn: () => void, ms: number) => {
        const t = { fn, ms, cleared: false };
        timers.push(t);
        return t;
      },
      clearTimer: (h: unknown) => void ((h as { cleared: boolean }).cleared = true),
    };
    const proxies = ['p-a', 'p-b', 'p-c'].map(fakeProxy);
    let target = 0;
    const b = balancer(proxies, () => target);
    const pools = new DataPools();
    const options = { backoffDeps, backoff: { firstMs: 20, maxMs: 60_000 } };
    attach(pools, b, proxies[0]!, options);
    attach(pools, b, proxies[1]!, options);
    // Every dial lands at p-a: each spare is closed a step slower than the one before.
    for (let step = 0; step < 6; step++) {
      await settled();
      const pending = timers.filter((t) => !t.cleared).at(-1)!;
      pending.cleared = true;
      pending.fn();
    }
    await settled();
    const slow = timers.filter((t) => !t.cleared).at(-1)!;
    expect(slow.ms).toBeGreaterThan(20 * 2 ** 4 / 2); // equal jitter: at least half of the sixth step's 640 ms
    // p-c joins, and the balancer now sends there: the slow step is replaced by one at the first pace.
    target = 2;
    attach(pools, b, proxies[2]!, options);
    await settled();
    expect(slow.cleared).toBe(true);
    const next = timers.filter((t) => !t.cleared).at(-1)!;
    expect(next).not.toBe(slow);
    expect(next.ms).toBeLessThanOrEqual(20);
    next.cleared = true;
    next.fn();
    await settled();
    expect(proxies[2]!.conns.size).toBeGreaterThanOrEqual(1);
  });

  it('a refusal backs off before the next dial; the pool fills once the Proxy takes them again', async () => {
    const delays: number[] = [];
    const backoffDeps = { setTimer: (fn: () => void, ms: number) => (delays.push(ms), setTimeout(fn, ms)), clearTimer: (h: unknown) => clearTimeout(h as NodeJS.Timeout) };
    const proxy = fakeProxy('p-a');
    proxy.refuse = 'pool-full';
    const b = balancer([proxy], () => 0);
    const pools = new DataPools();
    attach(pools, b, proxy, { backoffDeps });
    await waitUntil('three refusals', () => b.dials.length >= 3);
    // Each dial after a refusal waited for the backoff: as many delays as refused dials (less the one in flight).
    expect(delays.length).toBeGreaterThanOrEqual(b.dials.length - 1);
    expect(delays.every((d) => d >= 10 && d <= 50)).toBe(true);
    proxy.refuse = undefined;
    await waitUntil('the pool is whole', () => proxy.conns.size === 2);
  });

  it('a Proxy that answers nothing, garbage or an endless line: each connection closed at its bound or deadline, then the backoff; none kept', async () => {
    for (const lie of ['silent', Buffer.from('HTTP/1.1 200 OK\r\n\r\n'), Buffer.alloc(64 * 1024, 0x41), Buffer.from('GWDATA1 ok two words\n')] as const) {
      const delays: number[] = [];
      const backoffDeps = { setTimer: (fn: () => void, ms: number) => (delays.push(ms), setTimeout(fn, ms)), clearTimer: (h: unknown) => clearTimeout(h as NodeJS.Timeout) };
      const proxy = fakeProxy('p-a');
      proxy.lie = lie;
      const b = balancer([proxy], () => 0);
      const pools = new DataPools();
      const h = attach(pools, b, proxy, { backoffDeps, answerTimeoutMs: 100 });
      await waitUntil('three dials', () => b.dials.length >= 3);
      expect(delays.length, String(lie)).toBeGreaterThanOrEqual(b.dials.length - 1);
      expect(h.numbers).toEqual([]);
      expect(pools.poolOf('lb.example:443')!.waiting.size).toBe(0);
      h.detach();
    }
  });

  it("bytes right behind the answer, in its chunk, are the stream's: left unread for the e2e-open's taker", async () => {
    const proxy = fakeProxy('p-a');
    proxy.after = Buffer.from('\x16\x03\x01 a ClientHello');
    const b = balancer([proxy], () => 0);
    const pools = new DataPools();
    const h = attach(pools, b, proxy, { size: 1 });
    await waitUntil('one waits', () => h.numbers.length === 1);
    const socket = h.take(h.numbers[0]!) as Duplex;
    const got = once(socket, 'data');
    socket.resume();
    const [first] = (await got) as [Buffer];
    expect(first.toString('latin1')).toBe('\x16\x03\x01 a ClientHello');
  });

  it('an e2e-open from another Proxy’s tunnel cannot take a connection that waits elsewhere; its own Proxy’s can', async () => {
    const proxies = ['p-a', 'p-b'].map(fakeProxy);
    const b = balancer(proxies, (i) => i);
    const pools = new DataPools();
    const [ha, hb] = proxies.map((p) => attach(pools, b, p));
    await waitUntil('both hold 2', () => proxies.every((p) => p.conns.size === 2));
    const atA = [...proxies[0]!.conns.keys()][0]!;
    expect(hb!.take(atA)).toBeUndefined();
    expect(ha!.numbers).toContain(atA);
    const socket = ha!.take(atA);
    expect(socket).toBeDefined();
    expect(ha!.numbers).not.toContain(atA);
    expect(ha!.take(12345)).toBeUndefined();
  });

  it('an e2e-open that overtakes the answer waits for it: taken when it names this Proxy, not when it names another', async () => {
    const proxies = ['p-a', 'p-b'].map(fakeProxy);
    let release!: () => void;
    proxies[0]!.hold = new Promise((r) => (release = r));
    const b = balancer(proxies, () => 0);
    const pools = new DataPools();
    const ha = attach(pools, b, proxies[0]!);
    const hb = attach(pools, b, proxies[1]!);
    await waitUntil('p-a has a preamble', () => proxies[0]!.seen.length === 1);
    const n = proxies[0]!.seen[0]!;
    const fromB = hb.take(n);
    const fromA = ha.take(n);
    expect(fromA).toBeInstanceOf(Promise);
    // A flood of claims on the pending connection is bounded (one per tunnel at most can be honest).
    const flood = Array.from({ length: 100 }, () => hb.take(n));
    expect(flood.filter((f) => f === undefined).length).toBeGreaterThanOrEqual(100 - DATA_TUNNELS_MAX);
    release();
    expect(await fromB).toBeUndefined();
    expect(await fromA).toBeDefined();
    expect((await Promise.all(flood)).every((f) => f === undefined)).toBe(true);
  });

  it('tunnels to Proxies at distinct addresses: one pool each, each preamble with the one pair of its tunnel', async () => {
    const proxies = ['p-a', 'p-b'].map(fakeProxy);
    const pairs: number[] = [];
    const pools = new DataPools();
    for (const [i, p] of proxies.entries()) {
      const dialer = fakeDialer(() => {
        const [agentSide, proxySide] = duplexPair();
        proxySide.once('data', (chunk: Buffer) => {
          const parsed = parseDataPreamble(chunk);
          if (parsed.kind === 'ok') pairs.push(parsed.pairs.length);
        });
        serve(p, proxySide);
        return agentSide;
      });
      handles.push(pools.attach({ dialer, addr: `proxy-${i}:443`, proxyId: p.id, key: p.key, size: 2, log: logger('test') }));
    }
    await waitUntil('both hold 2', () => proxies.every((p) => p.conns.size === 2));
    expect(pairs.every((n) => n === 1)).toBe(true);
    expect(pools.poolOf('proxy-0:443')).not.toBe(pools.poolOf('proxy-1:443'));
  });

  it("a tunnel's end closes the connections waiting at its Proxy, no backoff; the last tunnel's end stops the pool", async () => {
    const proxies = ['p-a', 'p-b'].map(fakeProxy);
    const b = balancer(proxies, (i) => i);
    const pools = new DataPools();
    const [ha, hb] = proxies.map((p) => attach(pools, b, p));
    await waitUntil('both hold 2', () => proxies.every((p) => p.conns.size === 2));
    ha!.detach();
    await waitUntil("p-a's connections closed", () => proxies[0]!.conns.size === 0);
    expect(proxies[1]!.conns.size).toBe(2);
    hb!.detach();
    await waitUntil("p-b's connections closed", () => proxies[1]!.conns.size === 0);
    expect(pools.poolOf('lb.example:443')).toBeUndefined();
  });
});
