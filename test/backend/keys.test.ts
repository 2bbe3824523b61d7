import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { compareKeys, prefixSuccessor } from '../../src/backend/index.js';

/** The reference order: UTF-8 bytes, as SQLite's BINARY collation and PostgreSQL's "C" compare them. */
const byBytes = (a: string, b: string): number => Math.sign(Buffer.compare(Buffer.from(a, 'utf8'), Buffer.from(b, 'utf8')));

// Code points around the edges: the surrogate gap, the end of the BMP, the last code point.
const edgeChar = fc.constantFrom('a', 'b', '/', '%', '_', '\u007F', '\u0080', '\uD7FF', '\uE000', '\uFFFF', '\u{10000}', '😀', '\u{10FFFF}');
const edgeString = fc.string({ unit: edgeChar, maxLength: 6 });
const anyString = fc.string({ unit: 'binary', maxLength: 12 });

describe('backend keys', () => {
  it('compareKeys is UTF-8 byte order', () => {
    fc.assert(
      fc.property(fc.oneof(edgeString, anyString), fc.oneof(edgeString, anyString), (a, b) => {
        expect(Math.sign(compareKeys(a, b))).toBe(byBytes(a, b));
      }),
      { numRuns: 2000 },
    );
  });

  it('[prefix, prefixSuccessor(prefix)) holds exactly the strings that start with prefix', () => {
    fc.assert(
      fc.property(edgeString, edgeString, fc.boolean(), (prefix, tail, extend) => {
        const s = extend ? prefix + tail : tail;
        const upper = prefixSuccessor(prefix);
        const inRange = byBytes(s, prefix) >= 0 && (upper === undefined || byBytes(s, upper) < 0);
        expect(inRange).toBe(s.startsWith(prefix));
      }),
      { numRuns: 3000 },
    );
  });

  it('prefixSuccessor skips the surrogate gap and carries over U+10FFFF', () => {
    expect(prefixSuccessor('')).toBeUndefined();
    expect(prefixSuccessor('\u{10FFFF}\u{10FFFF}')).toBeUndefined();
    expect(prefixSuccessor('/users/')).toBe('/users0');
    expect(prefixSuccessor('a\uD7FF')).toBe('a\uE000');
    expect(prefixSuccessor('a\uFFFF')).toBe('a\u{10000}');
    expect(prefixSuccessor('a\u{10FFFF}')).toBe('b');
  });
});
