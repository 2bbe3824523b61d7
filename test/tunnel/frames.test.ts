/**
 * src/tunnel/frames.ts: the v2 frame codec. Every frame kind round-trips; a byte stream split anywhere decodes to
 * the same frames (DATA payloads concatenated per frame); hostile input (unknown types, oversize frames, wrong
 * lengths, frames no peer may send on the control stream, garbage) throws GW_ERR_TUNNEL_PROTOCOL and nothing else,
 * and the decoder never holds more than a header and a small payload.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { isGatewayError } from '../../src/errors.js';
import {
  FRAME_HEADER_BYTES,
  FrameDecoder,
  frameHeader,
  FrameType,
  MAX_FRAME_PAYLOAD,
  MAX_RST_REASON_BYTES,
  rstFrame,
  windowFrame,
  type FrameSink,
} from '../../src/tunnel/frames.js';

type Frame =
  | { type: 'data'; id: number; payload: Buffer }
  | { type: 'open'; id: number }
  | { type: 'window'; id: number; credit: number }
  | { type: 'fin'; id: number }
  | { type: 'rst'; id: number; reason: string };

/** Collects frames; DATA pieces of one frame are joined (as a byte stream would see them). */
class Collect implements FrameSink {
  frames: Frame[] = [];
  private parts: Buffer[] = [];
  private expected = 0;
  dataHeader(id: number, length: number): void {
    this.expected = length;
    this.parts = [];
    if (length === 0) this.frames.push({ type: 'data', id, payload: Buffer.alloc(0) });
  }
  data(id: number, payload: Buffer): void {
    this.parts.push(Buffer.from(payload));
    this.expected -= payload.length;
    expect(this.expected).toBeGreaterThanOrEqual(0);
    if (this.expected === 0) this.frames.push({ type: 'data', id, payload: Buffer.concat(this.parts) });
  }
  open(id: number): void {
    this.frames.push({ type: 'open', id });
  }
  window(id: number, credit: number): void {
    this.frames.push({ type: 'window', id, credit });
  }
  fin(id: number): void {
    this.frames.push({ type: 'fin', id });
  }
  rst(id: number, reason: string): void {
    this.frames.push({ type: 'rst', id, reason });
  }
}

function encode(f: Frame): Buffer {
  switch (f.type) {
    case 'data':
      return Buffer.concat([frameHeader(FrameType.DATA, f.id, f.payload.length), f.payload]);
    case 'open':
      return frameHeader(FrameType.OPEN, f.id, 0);
    case 'window':
      return windowFrame(f.id, f.credit);
    case 'fin':
      return frameHeader(FrameType.FIN, f.id, 0);
    case 'rst':
      return rstFrame(f.id, f.reason);
  }
}

function decodeAll(chunks: Buffer[]): Frame[] {
  const d = new FrameDecoder();
  const sink = new Collect();
  for (const c of chunks) d.push(c, sink);
  expect(d.pending).toBe(0);
  return sink.frames;
}

function protocolError(fn: () => void): string {
  try {
    fn();
  } catch (err) {
    expect(isGatewayError(err) && err.code).toBe('GW_ERR_TUNNEL_PROTOCOL');
    return (err as Error).message;
  }
  throw new Error('no error');
}

const id = fc.integer({ min: 1, max: 0xffff_ffff });
const frameArb: fc.Arbitrary<Frame> = fc.oneof(
  fc.record({ type: fc.constant('data' as const), id: fc.integer({ min: 0, max: 0xffff_ffff }), payload: fc.uint8Array({ maxLength: 300 }).map((a) => Buffer.from(a)) }),
  fc.record({ type: fc.constant('open' as const), id }),
  fc.record({ type: fc.constant('window' as const), id: fc.integer({ min: 0, max: 0xffff_ffff }), credit: fc.integer({ min: 1, max: 0xffff_ffff }) }),
  fc.record({ type: fc.constant('fin' as const), id }),
  fc.record({ type: fc.constant('rst' as const), id, reason: fc.string({ maxLength: 40 }) }),
);

describe('FrameDecoder', () => {
  it('round-trips every kind of frame', () => {
    const frames: Frame[] = [
      { type: 'open', id: 1 },
      { type: 'data', id: 1, payload: Buffer.from('{"service":"db"}\n') },
      { type: 'data', id: 0, payload: Buffer.alloc(0) },
      { type: 'window', id: 1, credit: 0xffff_ffff },
      { type: 'fin', id: 1 },
      { type: 'rst', id: 7, reason: 'closed' },
      { type: 'rst', id: 8, reason: '' },
      { type: 'data', id: 2, payload: Buffer.alloc(MAX_FRAME_PAYLOAD, 7) },
    ];
    expect(decodeAll([Buffer.concat(frames.map(encode))])).toEqual(frames);
  });

  it('property: a stream of frames split anywhere decodes to the same frames', () => {
    fc.assert(
      fc.property(fc.array(frameArb, { maxLength: 20 }), fc.array(fc.integer({ min: 0, max: 10_000 }), { maxLength: 30 }), (frames, cuts) => {
        const bytes = Buffer.concat(frames.map(encode));
        const at = [...new Set(cuts.map((c) => c % (bytes.length + 1)))].sort((a, b) => a - b);
        const chunks: Buffer[] = [];
        let from = 0;
        for (const c of at) {
          chunks.push(bytes.subarray(from, c));
          from = c;
        }
        chunks.push(bytes.subarray(from));
        expect(decodeAll(chunks)).toEqual(frames);
      }),
      { numRuns: 300 },
    );
  });

  it('byte by byte: holds at most a header and a small payload, never a DATA payload', () => {
    const bytes = Buffer.concat([encode({ type: 'data', id: 3, payload: Buffer.alloc(1000, 1) }), encode({ type: 'rst', id: 3, reason: 'x'.repeat(MAX_RST_REASON_BYTES) })]);
    const d = new FrameDecoder();
    const sink = new Collect();
    let most = 0;
    for (let i = 0; i < bytes.length; i++) {
      d.push(bytes.subarray(i, i + 1), sink);
      most = Math.max(most, d.pending);
    }
    expect(most).toBeLessThanOrEqual(FRAME_HEADER_BYTES + MAX_RST_REASON_BYTES);
    expect(sink.frames.map((f) => f.type)).toEqual(['data', 'rst']);
  });

  it('a whole DATA frame in one chunk is handed on as a view of that chunk, not a copy', () => {
    const chunk = encode({ type: 'data', id: 5, payload: Buffer.from('hello') });
    const seen: Buffer[] = [];
    const sink = new Collect();
    sink.data = (_id, p) => void seen.push(p);
    new FrameDecoder().push(chunk, sink);
    expect(seen).toHaveLength(1);
    expect(seen[0]!.buffer).toBe(chunk.buffer);
    expect(seen[0]!.toString()).toBe('hello');
  });

  it.each([
    ['an unknown frame type', Buffer.from([9, 0, 0, 0, 1, 0, 0, 0, 0]), /unknown frame type 9/],
    ['a payload over the cap (refused at the header, before any payload)', frameHeader(FrameType.DATA, 1, MAX_FRAME_PAYLOAD + 1), /at most/],
    ['a length of 4 GiB', Buffer.from([0, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff]), /at most/],
    ['a WINDOW of 3 bytes', frameHeader(FrameType.WINDOW, 1, 3), /WINDOW/],
    ['a WINDOW of 0', windowFrame(1, 0), /WINDOW of 0/],
    ['an OPEN with a payload', frameHeader(FrameType.OPEN, 1, 1), /payload/],
    ['a FIN with a payload', frameHeader(FrameType.FIN, 1, 2), /payload/],
    ['an RST reason over the cap', frameHeader(FrameType.RST, 1, MAX_RST_REASON_BYTES + 1), /RST reason/],
    ['an OPEN of the control stream', frameHeader(FrameType.OPEN, 0, 0), /control stream/],
    ['a FIN of the control stream', frameHeader(FrameType.FIN, 0, 0), /control stream/],
    ['an RST of the control stream', rstFrame(0, 'x'), /control stream/],
  ])('refuses %s with GW_ERR_TUNNEL_PROTOCOL, and keeps refusing', (_what, bytes, message) => {
    const d = new FrameDecoder();
    expect(protocolError(() => d.push(bytes, new Collect()))).toMatch(message);
    expect(protocolError(() => d.push(frameHeader(FrameType.OPEN, 2, 0), new Collect()))).toMatch(message);
  });

  it('fuzz: garbage either decodes or throws GW_ERR_TUNNEL_PROTOCOL, bounded, never anything else', () => {
    fc.assert(
      fc.property(fc.array(fc.uint8Array({ maxLength: 64 }), { maxLength: 20 }), (chunks) => {
        const d = new FrameDecoder();
        const sink = new Collect();
        try {
          for (const c of chunks) {
            d.push(Buffer.from(c), sink);
            expect(d.pending).toBeLessThanOrEqual(FRAME_HEADER_BYTES + MAX_RST_REASON_BYTES);
          }
        } catch (err) {
          expect(isGatewayError(err) && err.code).toBe('GW_ERR_TUNNEL_PROTOCOL');
        }
      }),
      { numRuns: 500 },
    );
  });

  it('an RST reason is cut to the cap on a character boundary', () => {
    const frame = rstFrame(1, 'é'.repeat(MAX_RST_REASON_BYTES));
    const [decoded] = decodeAll([frame]);
    expect(decoded).toMatchObject({ type: 'rst', id: 1 });
    const reason = (decoded as { reason: string }).reason;
    expect(Buffer.byteLength(reason)).toBeLessThanOrEqual(MAX_RST_REASON_BYTES);
    expect(reason).not.toContain('\uFFFD');
  });
});
