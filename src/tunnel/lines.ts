/**
 * One JSON line at the head of a stream (the dial request and its answer on a tunnel channel, the client's
 * route header): read with a size bound and a deadline, and whatever follows the line is pushed back into the
 * stream unread, so the bytes after it flow on untouched.
 */
import type { Duplex, Writable } from 'node:stream';
import { GatewayError } from '../errors.js';

export const MAX_LINE_BYTES = 64 * 1024;

export function readLine(stream: Duplex, options: { maxBytes?: number; timeoutMs?: number; what?: string } = {}): Promise<string> {
  const max = options.maxBytes ?? MAX_LINE_BYTES;
  const what = options.what ?? 'header line';
  return new Promise((resolve, reject) => {
    let buffered: Buffer = Buffer.alloc(0);
    let timer: NodeJS.Timeout | undefined;
    const done = () => {
      stream.off('readable', onReadable);
      stream.off('end', onEnd);
      stream.off('error', onError);
      stream.off('close', onEnd);
      if (timer) clearTimeout(timer);
    };
    const fail = (err: GatewayError) => {
      done();
      reject(err);
    };
    const onEnd = () => fail(new GatewayError('GW_ERR_TUNNEL_PROTOCOL', `the stream closed before its ${what} arrived`));
    const onError = (err: Error) => fail(new GatewayError('GW_ERR_TUNNEL_PROTOCOL', `the stream failed before its ${what} arrived: ${err.message}`));
    const onReadable = () => {
      let chunk: Buffer | null;
      while ((chunk = stream.read() as Buffer | null) !== null) {
        buffered = buffered.length === 0 ? chunk : Buffer.concat([buffered, chunk]);
        const nl = buffered.indexOf(0x0a);
        if (nl >= 0) {
          if (nl > max) return fail(new GatewayError('GW_ERR_TUNNEL_PROTOCOL', `${what} longer than ${max} bytes`));
          done();
          const rest = buffered.subarray(nl + 1);
          if (rest.length > 0) stream.unshift(rest);
          resolve(buffered.subarray(0, nl).toString('utf8'));
          return;
        }
        if (buffered.length > max) return fail(new GatewayError('GW_ERR_TUNNEL_PROTOCOL', `${what} longer than ${max} bytes`));
      }
    };
    if (options.timeoutMs) timer = setTimeout(() => fail(new GatewayError('GW_ERR_TUNNEL_TIMEOUT', `no ${what} within ${options.timeoutMs} ms`)), options.timeoutMs);
    stream.on('readable', onReadable);
    stream.once('end', onEnd);
    stream.once('close', onEnd);
    stream.once('error', onError);
    onReadable();
  });
}

export async function readJsonLine<T>(stream: Duplex, options: { maxBytes?: number; timeoutMs?: number; what?: string } = {}): Promise<T> {
  const line = await readLine(stream, options);
  try {
    const value = JSON.parse(line) as unknown;
    if (value === null || typeof value !== 'object' || Array.isArray(value)) throw new Error('not an object');
    return value as T;
  } catch {
    throw new GatewayError('GW_ERR_TUNNEL_PROTOCOL', `${options.what ?? 'header line'} is not a JSON object`);
  }
}

export function writeJsonLine(stream: Writable, value: unknown): boolean {
  return stream.write(`${JSON.stringify(value)}\n`);
}

/**
 * Joins two streams both ways with back-pressure (pipe) and half-close: when one side's readable half ends, the
 * other side's writable half is ended after it has written everything it holds. A side that closes without
 * having ended cleanly (reset, error, destroy) takes the other down with it; a side that ended cleanly leaves
 * the other to finish its own direction.
 */
export function splice(a: Duplex, b: Duplex, onClose?: () => void): void {
  let closed = 0;
  const closedOne = () => {
    if (++closed === 2) onClose?.();
  };
  const fail = () => {
    a.destroy();
    b.destroy();
  };
  a.pipe(b);
  b.pipe(a);
  a.once('error', fail);
  b.once('error', fail);
  a.once('close', () => {
    if (!a.readableEnded) b.destroy();
    closedOne();
  });
  b.once('close', () => {
    if (!b.readableEnded) a.destroy();
    closedOne();
  });
}
