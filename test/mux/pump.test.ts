/**
 * src/mux/pump.ts on real loopback sockets: bytes both ways, back-pressure against a reader that stops, half-close
 * passed through, a reset taking the other side down, and a peer that closes while its upstream stays silent.
 */
import { createHash } from 'node:crypto';
import net from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { passThrough } from '../../src/mux/pump.js';

const cleanups: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** A relay on loopback: each accepted socket pumped to a new connection to `target`. */
async function relay(target: number, allowHalfOpen: boolean): Promise<{ port: number; closed: Promise<void>[] }> {
  const closed: Promise<void>[] = [];
  const open: net.Socket[] = [];
  const server = net.createServer({ allowHalfOpen }, (socket) => {
    const upstream = net.connect({ host: '127.0.0.1', port: target, allowHalfOpen });
    open.push(socket, upstream);
    closed.push(new Promise((resolve) => passThrough(socket, upstream, resolve)));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  cleanups.push(() => {
    for (const s of open) s.destroy();
    return new Promise((r) => server.close(r));
  });
  return { port: (server.address() as net.AddressInfo).port, closed };
}

async function listen(onSocket: (s: net.Socket) => void, allowHalfOpen = true): Promise<number> {
  const server = net.createServer({ allowHalfOpen }, onSocket);
  const sockets = new Set<net.Socket>();
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('error', () => undefined);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  cleanups.push(() => {
    for (const s of sockets) s.destroy();
    return new Promise((r) => server.close(r));
  });
  return (server.address() as net.AddressInfo).port;
}

function connect(port: number): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const s = net.connect({ host: '127.0.0.1', port, allowHalfOpen: true }, () => resolve(s));
    s.once('error', reject);
    cleanups.push(() => s.destroy());
  });
}

const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');

describe('passThrough', () => {
  it('carries 32 MiB each way byte for byte and passes each half-close through', async () => {
    const size = 32 * 2 ** 20;
    const data = Buffer.alloc(size);
    for (let i = 0; i < size; i += 4) data.writeUInt32LE((i * 2654435761) >>> 0, i);
    // The backend echoes, then ends its side once the client has ended its own.
    const backend = await listen((s) => {
      s.on('data', (c: Buffer) => s.write(c));
      s.on('end', () => s.end());
    });
    const { port, closed } = await relay(backend, true);
    const client = await connect(port);
    const chunks: Buffer[] = [];
    client.on('data', (c: Buffer) => chunks.push(c));
    const ended = new Promise<void>((r) => client.once('end', r));
    client.end(data);
    await ended;
    expect(sha(Buffer.concat(chunks))).toBe(sha(data));
    client.destroy();
    await Promise.all(closed);
  });

  it('stops reading from a writer whose reader stopped, and goes on when it reads again', async () => {
    let backendSocket: net.Socket | undefined;
    const got = { bytes: 0 };
    const backend = await listen((s) => {
      backendSocket = s;
      s.pause(); // reads nothing until told
      s.on('data', (c: Buffer) => (got.bytes += c.length));
    });
    const { port } = await relay(backend, true);
    const client = await connect(port);
    const chunk = Buffer.alloc(64 * 1024, 1);
    // Write until the client's buffer stays full (no 'drain' within 300 ms): the kernel's buffers on the way fill
    // up first, then the relay's, which must stop reading rather than take everything into memory.
    let written = 0;
    const limit = 256 * 2 ** 20;
    while (written < limit) {
      while (written < limit && client.write(chunk)) written += chunk.length;
      written += chunk.length;
      const drainedInTime = await new Promise<boolean>((resolve) => {
        const timer = setTimeout(() => resolve(false), 300);
        client.once('drain', () => {
          clearTimeout(timer);
          resolve(true);
        });
      });
      if (!drainedInTime) break;
    }
    expect(written).toBeLessThan(limit);
    expect(client.writableLength).toBeGreaterThan(0);
    const drained = new Promise<void>((r) => client.once('drain', r));
    backendSocket!.resume();
    await drained;
    expect(got.bytes).toBeGreaterThan(0);
  });

  it('takes the upstream down when the client resets', async () => {
    // Reads, never ends its side: only the relay can close its end of this connection.
    const backend = await listen((s) => s.resume());
    const { port, closed } = await relay(backend, true);
    const client = await connect(port);
    client.write('hello');
    await new Promise((r) => setTimeout(r, 50));
    client.resetAndDestroy();
    await Promise.all(closed); // both of the relay's sockets closed
  });

  it('closes the upstream of a client that closed while the upstream stays silent (allowHalfOpen off)', async () => {
    // Reads, never ends its side: only the relay can close its end of this connection.
    const backend = await listen((s) => s.resume());
    const { port, closed } = await relay(backend, false);
    const client = await connect(port);
    client.write('hello');
    await new Promise((r) => setTimeout(r, 50));
    client.end();
    await Promise.all(closed); // both of the relay's sockets closed
  });
});
