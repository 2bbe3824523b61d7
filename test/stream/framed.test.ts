/**
 * src/stream/framed.ts: the frame parser fed byte by byte and in one piece, its bounds, and a FramedStream pair
 * on a real loopback connection: a clean end both ways, and the hostile ends (the connection's FIN without an end
 * frame, an oversize frame, bytes after the end frame) that destroy the stream without an end.
 */
import { once } from 'node:events';
import net from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { FRAME_MAX_BYTES, FramedStream, FrameReader } from '../../src/stream/framed.js';

const frame = (data: string | Buffer): Buffer => {
  const body = Buffer.from(data);
  const h = Buffer.alloc(4);
  h.writeUInt32BE(body.length);
  return Buffer.concat([h, body]);
};
const END = Buffer.alloc(4);

function read(bytes: Buffer, step: number): { data: string; ended: boolean } {
  const reader = new FrameReader();
  let data = '';
  for (let at = 0; at < bytes.length; at += step) reader.feed(bytes.subarray(at, at + step), (d) => (data += d.toString()));
  return { data, ended: reader.ended };
}

describe('FrameReader', () => {
  const stream = Buffer.concat([frame('hello '), frame('framed'), frame(' world'), END]);

  it('gives the same data and end fed whole, byte by byte, and in odd pieces', () => {
    for (const step of [stream.length, 1, 3, 7]) expect(read(stream, step)).toEqual({ data: 'hello framed world', ended: true });
  });

  it('has not ended before the end frame, however much data came', () => {
    expect(read(Buffer.concat([frame('a'), frame('b')]), 1)).toEqual({ data: 'ab', ended: false });
  });

  it('HOSTILE: refuses a frame over the bound and bytes after the end frame', () => {
    const big = Buffer.alloc(4);
    big.writeUInt32BE(FRAME_MAX_BYTES + 1);
    expect(() => new FrameReader().feed(big, () => undefined)).toThrow(/at most/);
    expect(() => read(Buffer.concat([END, frame('more')]), 64)).toThrow(/after its end frame/);
  });
});

const cleanups: Array<() => void> = [];
afterEach(() => {
  for (const c of cleanups.splice(0)) c();
});

async function pair(): Promise<[net.Socket, net.Socket]> {
  const server = net.createServer({ allowHalfOpen: true });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const client = net.connect({ port: (server.address() as net.AddressInfo).port, host: '127.0.0.1', allowHalfOpen: true });
  const [accepted] = (await once(server, 'connection')) as [net.Socket];
  server.close();
  for (const s of [client, accepted]) s.on('error', () => undefined);
  cleanups.push(() => {
    client.destroy();
    accepted.destroy();
  });
  return [client, accepted];
}

/** 'end' with the text read, or 'break' when the stream closed without ending. */
function outcome(stream: FramedStream): Promise<{ how: 'end' | 'break'; text: string }> {
  let text = '';
  stream.on('data', (d: Buffer) => (text += d.toString()));
  stream.on('error', () => undefined);
  return new Promise((resolve) => {
    stream.once('end', () => resolve({ how: 'end', text }));
    stream.once('close', () => setImmediate(() => resolve({ how: 'break', text })));
  });
}

describe('FramedStream', () => {
  it('carries both directions and ends each only with its end frame; then the connection closes', async () => {
    const [a, b] = await pair();
    const fa = new FramedStream(a);
    const fb = new FramedStream(b);
    const atB = outcome(fb);
    const atA = outcome(fa);
    fa.end(Buffer.alloc(3 * FRAME_MAX_BYTES + 5, 0x41));
    expect((await atB).text.length).toBe(3 * FRAME_MAX_BYTES + 5);
    fb.end('answer after the half-close');
    expect(await atA).toEqual({ how: 'end', text: 'answer after the half-close' });
    await Promise.all([once(a, 'close'), once(b, 'close')]);
  });

  it('HOSTILE: the connection ends (a FIN: a killed peer) without the end frame: a break, not an end', async () => {
    const [a, b] = await pair();
    const fb = new FramedStream(b);
    const atB = outcome(fb);
    a.write(frame('partial download'));
    a.end();
    expect(await atB).toEqual({ how: 'break', text: 'partial download' });
  });

  it('HOSTILE: an oversize frame or bytes after the end frame break the stream and reset the connection', async () => {
    const [a, b] = await pair();
    const fb = new FramedStream(b);
    const atB = outcome(fb);
    const big = Buffer.alloc(4);
    big.writeUInt32BE(0xffffffff);
    a.write(Buffer.concat([frame('x'), big]));
    expect((await atB).how).toBe('break');
    const reset = await new Promise<string>((resolve) => {
      a.once('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? 'error'));
      a.once('end', () => a.write(Buffer.alloc(0), (err) => resolve(err ? ((err as NodeJS.ErrnoException).code ?? 'error') : 'clean end')));
    });
    expect(reset).toMatch(/^(ECONNRESET|EPIPE)$/);
  });
});
