/**
 * src/tunnel/session.ts: two TunnelSessions (a Proxy's and an agent's) over a real loopback TCP connection, and
 * a hand-written peer for what no session sends: byte-exact streams (100 at once, 64 MiB), a slow reader that
 * bounds memory, half-close both ways, RST, and the protocol errors (a window overrun, frames for streams that
 * never were, an OPEN from the agent, oversize frames, garbage) that close the tunnel with GW_ERR_TUNNEL_PROTOCOL,
 * and too many streams, which the tunnel survives.
 */
import { createHash, randomBytes } from 'node:crypto';
import { once } from 'node:events';
import net from 'node:net';
import type { Duplex } from 'node:stream';
import { afterEach, describe, expect, it } from 'vitest';
import type { GatewayError } from '../../src/errors.js';
import { frameHeader, FrameType, MAX_FRAME_PAYLOAD, windowFrame } from '../../src/tunnel/frames.js';
import { INITIAL_WINDOW, SOCKET_BUFFER_BYTES, TunnelSession, type TunnelSessionOptions, type TunnelStream } from '../../src/tunnel/session.js';
import { waitUntil } from '../helpers/wait.js';

const cleanups: Array<() => void> = [];
afterEach(() => {
  for (const c of cleanups.splice(0)) c();
});

async function socketPair(): Promise<[net.Socket, net.Socket]> {
  const server = net.createServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const client = net.connect((server.address() as net.AddressInfo).port, '127.0.0.1');
  const [accepted] = (await once(server, 'connection')) as [net.Socket];
  await once(client, 'connect');
  server.close();
  // The hostile cases end with a reset the test's own end does not care about.
  client.on('error', () => undefined);
  accepted.on('error', () => undefined);
  cleanups.push(() => {
    client.destroy();
    accepted.destroy();
  });
  return [client, accepted];
}

interface Pair {
  proxy: TunnelSession;
  agent: TunnelSession;
  /** Streams the agent got, in order. */
  accepted: TunnelStream[];
  closed: { proxy?: GatewayError | 'clean'; agent?: GatewayError | 'clean' };
  proxySocket: net.Socket;
  agentSocket: net.Socket;
}

async function pair(options: Partial<TunnelSessionOptions> = {}, onStream?: (s: TunnelStream) => void): Promise<Pair> {
  const [a, b] = await socketPair();
  const accepted: TunnelStream[] = [];
  const closed: Pair['closed'] = {};
  const proxy = new TunnelSession(a, { ...options, role: 'proxy', onClose: (err) => (closed.proxy = err ?? 'clean') });
  const agent = new TunnelSession(b, {
    ...options,
    role: 'agent',
    onStream: (s) => {
      accepted.push(s);
      onStream?.(s);
    },
    onClose: (err) => (closed.agent = err ?? 'clean'),
  });
  return { proxy, agent, accepted, closed, proxySocket: a, agentSocket: b };
}

/** The agent echoes every stream back (a splice to itself). */
const echo = (s: Duplex) => s.pipe(s);

function sha(): { update(b: Buffer): void; digest(): string; bytes: number } {
  const h = createHash('sha256');
  const o = {
    bytes: 0,
    update(b: Buffer) {
      o.bytes += b.length;
      h.update(b);
    },
    digest: () => h.digest('hex'),
  };
  return o;
}

/** Writes `total` random bytes to w with back-pressure; resolves with their sha256 once written and ended. */
async function pump(w: Duplex, total: number, chunk = 64 * 1024): Promise<string> {
  const h = createHash('sha256');
  let left = total;
  while (left > 0) {
    const b = randomBytes(Math.min(chunk, left));
    left -= b.length;
    h.update(b);
    if (!w.write(b)) await once(w, 'drain');
  }
  w.end();
  return h.digest('hex');
}

async function drain(r: Duplex): Promise<{ digest: string; bytes: number }> {
  const h = sha();
  r.on('data', (b: Buffer) => h.update(b));
  await once(r, 'end');
  return { digest: h.digest(), bytes: h.bytes };
}

describe('TunnelSession over TCP', () => {
  it('each end chooses its own window: a small one at one end, a large one at the other, both hold', async () => {
    const [a, b] = await socketPair();
    const proxy = new TunnelSession(a, { role: 'proxy', window: INITIAL_WINDOW });
    let got: Promise<{ digest: string; bytes: number }> | undefined;
    new TunnelSession(b, { role: 'agent', window: 8 * 1024 * 1024, onStream: (s) => void (got = drain(s)) });
    const s = proxy.openStream();
    s.resume();
    const sent = await pump(s, 8 * 1024 * 1024);
    await waitUntil('the stream arrived', () => got !== undefined);
    expect((await got!).digest).toBe(sent);
  });

  it('the control stream carries lines both ways from the start', async () => {
    const p = await pair();
    p.proxy.control.write('{"type":"welcome"}\n');
    p.agent.control.write('{"type":"hello"}\n');
    const [fromProxy] = (await once(p.agent.control, 'data')) as [Buffer];
    const [fromAgent] = (await once(p.proxy.control, 'data')) as [Buffer];
    expect(fromProxy.toString()).toBe('{"type":"welcome"}\n');
    expect(fromAgent.toString()).toBe('{"type":"hello"}\n');
  });

  it('100 concurrent streams, each byte-exact both ways', async () => {
    const p = await pair({}, echo);
    const results = await Promise.all(
      Array.from({ length: 100 }, async (_, i) => {
        const s = p.proxy.openStream();
        const [sent, got] = await Promise.all([pump(s, 50_000 + i * 997, 7_000), drain(s)]);
        return sent === got.digest;
      }),
    );
    expect(results.every(Boolean)).toBe(true);
    await waitUntil('every stream forgotten at both ends', () => p.proxy.size === 0 && p.agent.size === 0);
  });

  it('64 MiB one way, byte-exact, with a 256 KiB window (many WINDOW frames)', async () => {
    let received: Promise<{ digest: string; bytes: number }> | undefined;
    const p = await pair({ window: 256 * 1024 }, (s) => {
      received = drain(s);
      s.end();
    });
    const s = p.proxy.openStream();
    s.resume();
    const sent = await pump(s, 64 * 1024 * 1024, 1024 * 1024);
    await waitUntil('the agent got the stream', () => received !== undefined);
    const got = await received!;
    expect(got.bytes).toBe(64 * 1024 * 1024);
    expect(got.digest).toBe(sent);
  });

  it('a slow reader: the sender stops after the window, and the receiver holds at most the window', async () => {
    const WINDOW = 512 * 1024;
    const p = await pair({ window: WINDOW });
    const s = p.proxy.openStream();
    await waitUntil('the agent got the stream', () => p.accepted.length === 1);
    const reader = p.accepted[0]!;
    reader.pause();
    const WRITTEN = 4 * WINDOW;
    for (let i = 0; i < WRITTEN / (64 * 1024); i++) s.write(Buffer.alloc(64 * 1024, 1));
    // The whole window arrives, and no credit comes back while nothing is read: the rest waits at the sender.
    await waitUntil('the window arrived and the credit is spent', () => reader.readableLength === WINDOW && s.sendCredit === 0);
    expect(reader.readableLength).toBe(WINDOW);
    expect(s.writableLength).toBeGreaterThan(0);
    // Reading resumes the flow, and everything arrives.
    const all = sha();
    reader.on('data', (b: Buffer) => all.update(b));
    reader.resume();
    s.end();
    await once(reader, 'end');
    expect(all.bytes).toBe(WRITTEN);
  });

  it('half-close both ways: each side ends its half and still reads the other', async () => {
    const p = await pair();
    const s = p.proxy.openStream();
    s.end('from the proxy');
    await waitUntil('the agent got the stream', () => p.accepted.length === 1);
    const a = p.accepted[0]!;
    const got = await drain(a);
    expect(got.bytes).toBe('from the proxy'.length);
    // The agent's half is still open.
    const back = drain(s);
    a.end('and back');
    expect((await back).bytes).toBe('and back'.length);
    await waitUntil('forgotten at both ends', () => p.proxy.size === 0 && p.agent.size === 0);
    expect(p.closed).toEqual({});
  });

  it('RST: destroying one end resets the other (closed without an error), the tunnel stays', async () => {
    const p = await pair();
    const s = p.proxy.openStream();
    s.write('x');
    await waitUntil('the agent got the stream', () => p.accepted.length === 1);
    const a = p.accepted[0]!;
    a.resume();
    const errors: Error[] = [];
    s.on('error', (e) => errors.push(e));
    a.destroy();
    await once(s, 'close');
    expect(s.resetByPeer).toBe(true);
    expect(s.resetReason).toBe('closed');
    expect(errors).toEqual([]);
    // Late writes to a reset stream go nowhere, and the tunnel still opens streams.
    const again = p.proxy.openStream();
    again.end('ok');
    await waitUntil('a second stream', () => p.accepted.length === 2);
    expect((await drain(p.accepted[1]!)).bytes).toBe(2);
    expect(p.closed).toEqual({});
  });

  it('too many streams: an OPEN over the cap is refused with RST, the others and the tunnel stay', async () => {
    const p = await pair({ maxStreams: 3 }, echo);
    const streams = Array.from({ length: 4 }, () => p.proxy.openStream());
    await once(streams[3]!, 'close');
    expect(streams[3]!.resetReason).toMatch(/too many streams/);
    streams[0]!.end('still here');
    expect((await drain(streams[0]!)).bytes).toBe('still here'.length);
    expect(p.closed).toEqual({});
  });

  it('a peer that stops reading: writes wait for the socket to drain instead of piling up in it', async () => {
    const p = await pair({ window: 64 * 1024 * 1024 }); // a window that does not stop the sender
    const s = p.proxy.openStream();
    p.agentSocket.pause(); // the agent's process stops reading the connection
    const TOTAL = 48 * 1024 * 1024; // more than loopback's kernel buffers hold
    for (let i = 0; i < TOTAL / (64 * 1024); i++) s.write(Buffer.alloc(64 * 1024));
    await waitUntil('the socket is full', () => p.proxySocket.writableNeedDrain && p.proxySocket.writableLength > 0 && s.writableLength > 0);
    // At most a frame past the session's mark: the rest is still the stream's own (the writer's back-pressure).
    expect(p.proxySocket.writableLength).toBeLessThan(SOCKET_BUFFER_BYTES + 2 * 64 * 1024);
    expect(s.writableLength).toBeGreaterThan(TOTAL / 4);
  });
});

/** A session facing raw bytes from a peer the test plays. */
async function facing(role: 'proxy' | 'agent', window = INITIAL_WINDOW): Promise<{ session: TunnelSession; peer: net.Socket; closed: () => GatewayError | 'clean' | undefined; accepted: TunnelStream[] }> {
  const [mine, peer] = await socketPair();
  let closed: GatewayError | 'clean' | undefined;
  const accepted: TunnelStream[] = [];
  const session = new TunnelSession(mine, { role, window, onStream: (s) => accepted.push(s), onClose: (err) => (closed = err ?? 'clean') });
  peer.resume();
  return { session, peer, closed: () => closed, accepted };
}

const data = (id: number, payload: Buffer) => Buffer.concat([frameHeader(FrameType.DATA, id, payload.length), payload]);

describe('hostile peers: protocol errors close the tunnel with GW_ERR_TUNNEL_PROTOCOL', () => {
  it.each([
    ['DATA beyond the window', 'agent', () => Buffer.concat([frameHeader(FrameType.OPEN, 1, 0), data(1, Buffer.alloc(INITIAL_WINDOW - 10)), data(1, Buffer.alloc(11))]), /beyond the window/],
    ['DATA on a stream never opened', 'agent', () => data(5, Buffer.from('x')), /never opened/],
    ['a WINDOW for a stream never opened', 'proxy', () => windowFrame(9, 100), /never opened/],
    ['an OPEN from the agent', 'proxy', () => frameHeader(FrameType.OPEN, 1, 0), /OPEN from the agent/],
    ['a stream ID opened twice', 'agent', () => Buffer.concat([frameHeader(FrameType.OPEN, 2, 0), frameHeader(FrameType.OPEN, 2, 0)]), /opened again/],
    ['a lower stream ID after a higher one', 'agent', () => Buffer.concat([frameHeader(FrameType.OPEN, 5, 0), frameHeader(FrameType.OPEN, 3, 0)]), /opened again/],
    ['an oversize frame', 'agent', () => frameHeader(FrameType.DATA, 0, MAX_FRAME_PAYLOAD + 1), /at most/],
    ['DATA after FIN', 'agent', () => Buffer.concat([frameHeader(FrameType.OPEN, 1, 0), frameHeader(FrameType.FIN, 1, 0), data(1, Buffer.from('x'))]), /after its FIN/],
    ['a window overflow', 'agent', () => Buffer.concat([windowFrame(0, 0xffff_0000), windowFrame(0, 0xffff_0000)]), /overflow/],
    ['garbage after the handshake', 'agent', () => Buffer.from('GET / HTTP/1.1\r\nHost: x\r\n\r\n'), /unknown frame type|at most/],
  ] as const)('%s', async (_what, role, bytes, message) => {
    const f = await facing(role);
    f.peer.write(bytes());
    await waitUntil('the session closed', () => f.closed() !== undefined);
    const err = f.closed();
    expect(err).not.toBe('clean');
    expect((err as GatewayError).code).toBe('GW_ERR_TUNNEL_PROTOCOL');
    expect((err as GatewayError).message).toMatch(message);
    expect(f.session.isClosed).toBe(true);
    await waitUntil('the connection closed', () => f.peer.destroyed || f.peer.readableEnded);
  });

  it('frames for a stream that is gone (in flight when it closed) are ignored', async () => {
    const f = await facing('agent');
    f.peer.write(frameHeader(FrameType.OPEN, 1, 0));
    await waitUntil('the stream', () => f.accepted.length === 1);
    f.accepted[0]!.destroy();
    f.peer.write(Buffer.concat([data(1, Buffer.from('late')), windowFrame(1, 10), frameHeader(FrameType.FIN, 1, 0)]));
    f.peer.write(frameHeader(FrameType.OPEN, 2, 0));
    await waitUntil('the next stream', () => f.accepted.length === 2);
    expect(f.closed()).toBeUndefined();
  });
});
