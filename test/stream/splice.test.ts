import net from 'node:net';
import { Duplex } from 'node:stream';
import { afterEach, describe, expect, it } from 'vitest';
import { splice } from '../../src/stream/splice.js';

/** A connected pair of TCP sockets on loopback, both allowing half-close. */
async function socketPair(): Promise<[net.Socket, net.Socket]> {
  const server = net.createServer({ allowHalfOpen: true });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const accepted = new Promise<net.Socket>((resolve) => server.once('connection', resolve));
  const client = net.connect({ port: (server.address() as net.AddressInfo).port, host: '127.0.0.1', allowHalfOpen: true });
  const other = await accepted;
  server.close();
  return [client, other];
}

function collect(socket: net.Socket): { text: () => string; ended: Promise<void> } {
  let text = '';
  socket.on('data', (d: Buffer) => (text += d.toString()));
  socket.on('error', () => undefined);
  return {
    text: () => text,
    ended: new Promise((resolve) => socket.once('end', () => resolve())),
  };
}

const open: net.Socket[] = [];
afterEach(() => {
  for (const s of open.splice(0)) s.destroy();
});

describe('splice', () => {
  it('carries bytes both ways and passes a half-close on; the other direction keeps working', async () => {
    const [left, a] = await socketPair();
    const [b, right] = await socketPair();
    open.push(left, a, b, right);
    let closedBoth = false;
    const done = new Promise<void>((resolve) =>
      splice(a, b, () => {
        closedBoth = true;
        resolve();
      }),
    );
    const atRight = collect(right);
    const atLeft = collect(left);
    left.end('from the left');
    await atRight.ended;
    expect(atRight.text()).toBe('from the left');
    expect(closedBoth).toBe(false);
    right.end('answer after the half-close');
    await atLeft.ended;
    expect(atLeft.text()).toBe('answer after the half-close');
    await done;
    expect(closedBoth).toBe(true);
  });

  it('HOSTILE: a side that is reset resets the other: the right side sees ECONNRESET, never a clean end', async () => {
    const [left, a] = await socketPair();
    const [b, right] = await socketPair();
    open.push(left, a, b, right);
    splice(a, b);
    right.write('some bytes');
    await new Promise<void>((resolve) => left.once('data', () => resolve()));
    const atRight = new Promise<string>((resolve) => {
      right.once('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? err.message));
      // libuv may report an RST as an end; a zero-length write then fails, where after a FIN it succeeds.
      right.once('end', () => right.write(Buffer.alloc(0), (err) => resolve(err ? ((err as NodeJS.ErrnoException).code ?? 'error') : 'clean end')));
    });
    left.resetAndDestroy();
    expect(await atRight).toMatch(/^(ECONNRESET|EPIPE)$/);
    expect(b.destroyed).toBe(true);
  });

  it('a clean end of one side still ends the other with every byte (no false reset)', async () => {
    const [left, a] = await socketPair();
    const [b, right] = await socketPair();
    open.push(left, a, b, right);
    splice(a, b);
    const atRight = collect(right);
    const big = Buffer.alloc(8 * 1024 * 1024, 0x62);
    left.end(big);
    await atRight.ended;
    expect(atRight.text().length).toBe(big.length);
    // The right side's end was a FIN: its own direction still works.
    const atLeft = collect(left);
    right.end('reply');
    await atLeft.ended;
    expect(atLeft.text()).toBe('reply');
  });

  it('a side that ended and then closed while the other still sends takes the other down (its bytes have nowhere to go)', async () => {
    const [left, a] = await socketPair();
    open.push(left, a);
    // b stands for a tunnel channel: the agent ends it (EOF) and closes it, with no error, while the client still sends.
    const b = new Duplex({ allowHalfOpen: true, read() {}, write: (_chunk, _enc, cb) => setTimeout(cb, 1) });
    splice(a, b);
    left.on('error', () => undefined);
    const leftGone = new Promise<void>((resolve) => left.once('close', () => resolve()));
    const chunk = Buffer.alloc(64 * 1024, 0x61);
    const pump = () => {
      while (!left.destroyed && left.write(chunk));
    };
    left.on('drain', pump);
    left.resume();
    pump();
    b.push(null);
    await new Promise<void>((resolve) => b.once('end', () => resolve()));
    b.destroy();
    // Without the rule a stays paused with the left's bytes unread until something times it out.
    await leftGone;
    expect(a.destroyed).toBe(true);
  }, 10_000);
});
