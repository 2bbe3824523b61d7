import { PassThrough } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { clientAddress, setClientAddress, StreamMeta, wrapStream } from '../../src/stream/meta.js';

describe('StreamMeta', () => {
  it('keeps a value per stream, nothing on the stream object itself', () => {
    const meta = new StreamMeta<string>();
    const a = new PassThrough();
    const b = new PassThrough();
    const keysBefore = Object.keys(a).sort();
    meta.set(a, 'for a');
    expect(meta.get(a)).toBe('for a');
    expect(meta.get(b)).toBeUndefined();
    expect(Object.keys(a).sort()).toEqual(keysBefore);
  });

  it('a wrapping stream sees what its inner stream has, one level down, unless it has its own', () => {
    const meta = new StreamMeta<string>();
    const inner = new PassThrough();
    const outer = new PassThrough();
    const outermost = new PassThrough();
    wrapStream(outer, inner);
    wrapStream(outermost, outer);
    meta.set(inner, 'inner');
    expect(meta.get(outer)).toBe('inner');
    expect(meta.get(outermost)).toBeUndefined();
    meta.set(outer, 'own');
    expect(meta.get(outer)).toBe('own');
  });

  it('kinds do not mix', () => {
    const one = new StreamMeta<string>();
    const two = new StreamMeta<number>();
    const s = new PassThrough();
    one.set(s, 'x');
    expect(two.get(s)).toBeUndefined();
  });
});

describe('clientAddress', () => {
  it('is the address recorded for the stream (or the stream it wraps), else the peer', () => {
    const routed = Object.assign(new PassThrough(), { remoteAddress: '10.0.0.1', remotePort: 1000 });
    const tls = Object.assign(new PassThrough(), { remoteAddress: '10.0.0.1', remotePort: 1000 });
    expect(clientAddress(routed)).toEqual({ address: '10.0.0.1', port: 1000 });
    setClientAddress(routed, '203.0.113.7', 51000);
    wrapStream(tls, routed);
    expect(clientAddress(routed)).toEqual({ address: '203.0.113.7', port: 51000 });
    expect(clientAddress(tls)).toEqual({ address: '203.0.113.7', port: 51000 });
    expect(clientAddress({})).toEqual({ address: 'unknown', port: 0 });
  });
});
