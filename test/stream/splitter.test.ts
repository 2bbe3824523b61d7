import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { isGatewayError } from '../../src/errors.js';
import { LineSplitter } from '../../src/stream/splitter.js';

const b = (s: string) => Buffer.from(s, 'utf8');
const text = (lines: Buffer[]) => lines.map((l) => l.toString('utf8'));

/** The protocol error, and nothing else. */
function expectProtocolError(fn: () => unknown, what = 'line'): void {
  let thrown: unknown;
  try {
    fn();
  } catch (err) {
    thrown = err;
  }
  expect(isGatewayError(thrown) && thrown.code === 'GW_ERR_TUNNEL_PROTOCOL').toBe(true);
  expect((thrown as Error).message).toContain(what);
}

describe('LineSplitter', () => {
  it('gives the lines of one chunk, without their newlines, empty lines included', () => {
    expect(text(new LineSplitter(100).lines(b('a\n\nbc\n')))).toEqual(['a', '', 'bc']);
  });

  it('keeps an unfinished line until its newline arrives', () => {
    const s = new LineSplitter(100);
    expect(s.lines(b('hel'))).toEqual([]);
    expect(s.pending).toBe(3);
    expect(text(s.lines(b('lo\nwor')))).toEqual(['hello']);
    expect(s.pending).toBe(3);
    expect(text(s.lines(b('ld\n')))).toEqual(['world']);
    expect(s.pending).toBe(0);
  });

  it('feed stops at the first line and hands back the bytes after it untouched', () => {
    const s = new LineSplitter(100);
    expect(s.feed(b('{"a":1}'))).toEqual({ kind: 'need-more' });
    const r = s.feed(Buffer.concat([b('\n'), Buffer.from([0xff, 0x00, 0x0a, 0x16])]));
    expect(r.kind).toBe('line');
    if (r.kind !== 'line') return;
    expect(r.line.toString()).toBe('{"a":1}');
    expect([...r.rest]).toEqual([0xff, 0x00, 0x0a, 0x16]);
    expect(s.pending).toBe(0);
  });

  it('a UTF-8 character split across two chunks comes out whole', () => {
    const bytes = b('grüße\n');
    const s = new LineSplitter(100);
    const cut = bytes.indexOf(0xc3) + 1; // inside "ü"
    expect(s.lines(bytes.subarray(0, cut))).toEqual([]);
    expect(text(s.lines(bytes.subarray(cut)))).toEqual(['grüße']);
  });

  it('accepts a line of exactly maxBytes and refuses one byte more', () => {
    expect(text(new LineSplitter(4).lines(b('abcd\n')))).toEqual(['abcd']);
    expectProtocolError(() => new LineSplitter(4, 'control line').lines(b('abcde\n')), 'control line longer than 4 bytes');
  });

  it('refuses a line over the cap before its newline arrives, holding no more than the cap', () => {
    const s = new LineSplitter(8);
    expect(s.lines(b('12345678'))).toEqual([]);
    expect(s.pending).toBe(8);
    expectProtocolError(() => s.lines(b('9')));
    expect(s.pending).toBe(0);
  });

  it('stays failed: every later feed throws, nothing more is kept', () => {
    const s = new LineSplitter(2);
    expectProtocolError(() => s.feed(b('abc')));
    expectProtocolError(() => s.feed(b('\n')));
    expectProtocolError(() => s.lines(b('ok\n')));
    expect(s.pending).toBe(0);
  });

  describe('fuzz', () => {
    /** Bytes weighted towards newlines, so that lines come in all lengths around the cap. */
    const bytes = fc.array(fc.oneof({ arbitrary: fc.constant(0x0a), weight: 1 }, { arbitrary: fc.integer({ min: 0, max: 255 }), weight: 6 }), { maxLength: 400 });

    /** Cut points that split input into chunks (empty chunks included). */
    const chunked = (input: number[]) =>
      fc.array(fc.integer({ min: 0, max: input.length }), { maxLength: 20 }).map((cuts) => {
        const points = [0, ...cuts.sort((x, y) => x - y), input.length];
        return points.slice(1).map((end, i) => Buffer.from(input.slice(points[i]!, end)));
      });

    it('whatever the bytes and chunks: the reference lines, or the protocol error when a line is too long; never more than the cap held', () => {
      fc.assert(
        fc.property(
          bytes.chain((input) => fc.tuple(fc.constant(input), chunked(input), fc.integer({ min: 0, max: 40 }))),
          ([input, chunks, max]) => {
            const all = Buffer.from(input);
            const segments: Buffer[] = [];
            let start = 0;
            for (let nl = all.indexOf(0x0a); nl >= 0; nl = all.indexOf(0x0a, start)) {
              segments.push(all.subarray(start, nl));
              start = nl + 1;
            }
            const firstLong = [...segments, all.subarray(start)].findIndex((l) => l.length > max);
            const tooLong = firstLong >= 0;
            const s = new LineSplitter(max);
            const got: Buffer[] = [];
            let failed: unknown;
            for (const chunk of chunks) {
              try {
                got.push(...s.lines(chunk));
              } catch (err) {
                failed = err;
                break;
              }
              expect(s.pending).toBeLessThanOrEqual(max);
            }
            if (tooLong) {
              expect(isGatewayError(failed) && failed.code === 'GW_ERR_TUNNEL_PROTOCOL').toBe(true);
              // What came out before the error is the start of the reference, before the long line.
              expect(got.length).toBeLessThanOrEqual(firstLong);
              got.forEach((line, i) => expect(line.equals(segments[i]!)).toBe(true));
            } else {
              expect(failed).toBeUndefined();
              expect(got.map((l) => l.toString('hex'))).toEqual(segments.map((l) => l.toString('hex')));
              expect(s.pending).toBe(all.length - start);
            }
          },
        ),
        { numRuns: 500 },
      );
    });
  });
});
