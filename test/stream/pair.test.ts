/** src/stream/pair.ts: two in-memory ends, with backpressure, half-close and a destroy that reaches both. */
import { once } from 'node:events';
import { describe, expect, it } from 'vitest';
import { duplexPair } from '../../src/stream/pair.js';

describe('duplexPair', () => {
  it('carries bytes both ways and half-closes one direction at a time', async () => {
    const [a, b] = duplexPair();
    a.end('ping');
    const got: Buffer[] = [];
    b.on('data', (c: Buffer) => got.push(c));
    await once(b, 'end');
    expect(Buffer.concat(got).toString()).toBe('ping');
    b.end('pong');
    const [back] = (await once(a, 'data')) as [Buffer];
    expect(back.toString()).toBe('pong');
  });

  it('a writer whose reader does not read is held back, not buffered without end', () => {
    const [a] = duplexPair();
    let accepted = 0;
    while (a.write(Buffer.alloc(16 * 1024)) && accepted < 1000) accepted++;
    expect(accepted).toBeLessThan(1000);
  });

  it('destroying one end destroys the other', async () => {
    const [a, b] = duplexPair();
    a.destroy();
    await once(b, 'close');
    expect(b.destroyed).toBe(true);
  });
});
