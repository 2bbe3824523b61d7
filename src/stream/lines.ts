/**
 * One JSON line at the head of a stream (the dial request and its answer on a tunnel channel, the client's
 * route header): read with a size bound and a deadline, and whatever follows the line is pushed back into the
 * stream unread, so the bytes after it flow on untouched.
 */
import type { Duplex, Writable } from 'node:stream';
import { GatewayError } from '../errors.js';
import { LineSplitter, type LineResult } from './splitter.js';

export const MAX_LINE_BYTES = 64 * 1024;

export function readLine(stream: Duplex, options: { maxBytes?: number; timeoutMs?: number; what?: string } = {}): Promise<string> {
  const what = options.what ?? 'header line';
  const splitter = new LineSplitter(options.maxBytes ?? MAX_LINE_BYTES, what);
  return new Promise((resolve, reject) => {
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
        let result: LineResult;
        try {
          result = splitter.feed(chunk);
        } catch (err) {
          return fail(err as GatewayError); // the splitter throws nothing but its GatewayError
        }
        if (result.kind === 'line') {
          done();
          if (result.rest.length > 0) stream.unshift(result.rest);
          resolve(result.line.toString('utf8'));
          return;
        }
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
