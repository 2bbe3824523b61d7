import { PassThrough } from 'node:stream';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { isGatewayError } from '../../src/errors.js';
import { readJsonLine, readLine, writeJsonLine } from '../../src/stream/lines.js';
import { codeOf } from '../helpers/errors.js';


/** Everything the stream still holds for a reader (it is ended first). */
async function restOf(stream: PassThrough): Promise<Buffer> {
  stream.end();
  const parts: Buffer[] = [];
  for await (const chunk of stream) parts.push(chunk as Buffer);
  return Buffer.concat(parts);
}

describe('readLine', () => {
  afterEach(() => vi.useRealTimers());

  it('reads the first line and leaves every byte after it in the stream', async () => {
    const s = new PassThrough();
    s.write('{"resource":"db"}\nafter\n');
    s.write(Buffer.from([0, 1, 2]));
    expect(await readLine(s)).toBe('{"resource":"db"}');
    expect((await restOf(s)).toString('latin1')).toBe('after\n\x00\x01\x02');
  });

  it('waits for a line written in pieces', async () => {
    const s = new PassThrough();
    const line = readLine(s);
    s.write('{"a":');
    s.write('1}');
    s.write('\n');
    expect(await line).toBe('{"a":1}');
  });

  it('bounds the line, not what follows it: bytes after the line may be longer than the cap', async () => {
    const s = new PassThrough();
    s.write(Buffer.concat([Buffer.from('ok\n'), Buffer.alloc(100, 0x41)]));
    expect(await readLine(s, { maxBytes: 10 })).toBe('ok');
    expect((await restOf(s)).length).toBe(100);
  });

  it('refuses a line over the cap without waiting for its newline', async () => {
    const s = new PassThrough();
    const line = readLine(s, { maxBytes: 10, what: 'dial request' });
    s.write('x'.repeat(11));
    await expect(line).rejects.toThrow('dial request longer than 10 bytes');
    const other = new PassThrough();
    other.write('y'.repeat(20));
    expect(await codeOf(readLine(other, { maxBytes: 10 }))).toBe('GW_ERR_TUNNEL_PROTOCOL');
  });

  it('fails when the stream ends or fails first', async () => {
    const ended = new PassThrough();
    const a = readLine(ended, { what: 'hello' });
    ended.end('no newline');
    await expect(a).rejects.toThrow('the stream closed before its hello arrived');
    const failed = new PassThrough();
    const b = readLine(failed);
    failed.destroy(new Error('reset'));
    expect(await codeOf(b)).toBe('GW_ERR_TUNNEL_PROTOCOL');
  });

  it('fails with a timeout error when no line comes within the deadline', async () => {
    vi.useFakeTimers();
    const s = new PassThrough();
    const line = readLine(s, { timeoutMs: 1000, what: 'dial answer' });
    line.catch(() => undefined);
    s.write('partial');
    vi.advanceTimersByTime(999);
    expect(await Promise.race([line.then(() => 'settled', () => 'settled'), Promise.resolve('pending')])).toBe('pending');
    vi.advanceTimersByTime(1);
    await expect(line).rejects.toThrow('no dial answer within 1000 ms');
    expect(await codeOf(line)).toBe('GW_ERR_TUNNEL_TIMEOUT');
  });
});

describe('readJsonLine and writeJsonLine', () => {
  it('a JSON object written as a line reads back equal', async () => {
    const s = new PassThrough();
    writeJsonLine(s, { service: 'db', resource: 'ünïcode' });
    expect(await readJsonLine(s)).toEqual({ service: 'db', resource: 'ünïcode' });
  });

  it.each([['[1,2]'], ['null'], ['"text"'], ['{not json']])('refuses %s: not a JSON object', async (line) => {
    const s = new PassThrough();
    s.write(`${line}\n`);
    await expect(readJsonLine(s, { what: 'route header' })).rejects.toThrow('route header is not a JSON object');
  });
});
