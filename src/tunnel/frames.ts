/**
 * Tunnel protocol v2 framing (ALPN gateway-reversetunnel-v2): streams multiplexed straight over the mutual-TLS
 * connection between an agent and a Proxy. Pure, bounded and incremental, in the house style of src/mux/.
 *
 *   frame   = type u8 | stream id u32 (big-endian) | length u32 (big-endian) | payload (length bytes)
 *
 *   DATA    0  bytes of the stream; counted against the receiver's window (any stream, 0 included)
 *   OPEN    1  Proxy → agent: a new stream (length 0); its first bytes (DATA) are the DialRequest line
 *   WINDOW  2  credit: the receiver may be sent u32 more bytes on this stream (length 4, credit >= 1)
 *   FIN     3  the sender's half is over (length 0): the receiver's readable side ends
 *   RST     4  the stream is aborted (payload: a short UTF-8 reason, at most MAX_RST_REASON_BYTES)
 *
 * Stream 0 is the control channel (JSON lines), open from the start on both ends: only DATA and WINDOW may name
 * it. Anything else is a protocol error that closes the tunnel: an unknown type (there is no extension rule: a
 * newer protocol gets a new ALPN name), a payload over MAX_FRAME_PAYLOAD, a length other than the type allows,
 * OPEN/FIN/RST on stream 0, a WINDOW of 0. The decoder throws GatewayError GW_ERR_TUNNEL_PROTOCOL (nothing else)
 * and every later push throws it again.
 *
 * Memory: DATA payloads are never held. Each piece of a DATA payload that a chunk carries is handed on at once
 * as a subarray of that chunk (a frame split across chunks arrives in several pieces, which a byte stream does
 * not mind); only a header (9 bytes) and the payload of a WINDOW or RST (at most 4 + MAX_RST_REASON_BYTES) are
 * copied while incomplete.
 */
import { GatewayError } from '../errors.js';

export const FRAME_HEADER_BYTES = 9;
export const MAX_FRAME_PAYLOAD = 256 * 1024;
export const MAX_RST_REASON_BYTES = 256;
export const CONTROL_STREAM = 0;
export const MAX_STREAM_ID = 0xffff_ffff;

export const FrameType = { DATA: 0, OPEN: 1, WINDOW: 2, FIN: 3, RST: 4 } as const;
export type FrameTypeCode = (typeof FrameType)[keyof typeof FrameType];

/** What the decoder hands on, frame by frame, in order. Methods, not closures per frame. */
export interface FrameSink {
  /** A piece of a DATA frame's payload (a whole frame's payload when it arrived in one chunk). */
  data(id: number, payload: Buffer): void;
  /** A DATA frame starts: length bytes will follow in data() pieces (0: an empty frame, no data() call). */
  dataHeader(id: number, length: number): void;
  open(id: number): void;
  window(id: number, credit: number): void;
  fin(id: number): void;
  rst(id: number, reason: string): void;
}

const protocolError = (message: string) => new GatewayError('GW_ERR_TUNNEL_PROTOCOL', `tunnel v2: ${message}`);

/** The checks a header alone allows; throws on a frame that no valid peer sends. */
function checkHeader(type: number, id: number, length: number): void {
  if (length > MAX_FRAME_PAYLOAD) throw protocolError(`a frame of ${length} bytes (at most ${MAX_FRAME_PAYLOAD})`);
  switch (type) {
    case FrameType.DATA:
      return;
    case FrameType.WINDOW:
      if (length !== 4) throw protocolError(`a WINDOW frame of ${length} bytes (4)`);
      return;
    case FrameType.OPEN:
    case FrameType.FIN:
      if (length !== 0) throw protocolError(`an ${type === FrameType.OPEN ? 'OPEN' : 'FIN'} frame with a payload`);
      if (id === CONTROL_STREAM) throw protocolError('OPEN or FIN on the control stream');
      return;
    case FrameType.RST:
      if (length > MAX_RST_REASON_BYTES) throw protocolError(`an RST reason of ${length} bytes (at most ${MAX_RST_REASON_BYTES})`);
      if (id === CONTROL_STREAM) throw protocolError('RST on the control stream');
      return;
    default:
      throw protocolError(`unknown frame type ${type}`);
  }
}

export class FrameDecoder {
  private readonly header = Buffer.alloc(FRAME_HEADER_BYTES);
  private headerHeld = 0;
  /** The frame being read (after its header): type, id and payload bytes still to come. */
  private type = -1;
  private id = 0;
  private remaining = 0;
  /** The payload of a WINDOW or RST being assembled (never DATA). */
  private small: Buffer | undefined;
  private smallHeld = 0;
  private failure: GatewayError | undefined;

  /** Bytes held of an incomplete frame (header and WINDOW/RST payload; never DATA). */
  get pending(): number {
    return this.headerHeld + this.smallHeld;
  }

  /** Feeds a chunk; every frame (or DATA piece) it completes goes to sink, in order. */
  push(chunk: Buffer, sink: FrameSink): void {
    if (this.failure) throw this.failure;
    try {
      this.feed(chunk, sink);
    } catch (err) {
      this.failure = err instanceof GatewayError ? err : protocolError((err as Error).message);
      this.small = undefined;
      throw this.failure;
    }
  }

  private feed(chunk: Buffer, sink: FrameSink): void {
    let at = 0;
    const end = chunk.length;
    while (at < end) {
      if (this.type < 0) {
        // A whole header in the chunk and nothing held: read it in place.
        if (this.headerHeld === 0 && end - at >= FRAME_HEADER_BYTES) {
          this.begin(chunk.readUInt8(at), chunk.readUInt32BE(at + 1), chunk.readUInt32BE(at + 5), sink);
          at += FRAME_HEADER_BYTES;
        } else {
          const take = Math.min(FRAME_HEADER_BYTES - this.headerHeld, end - at);
          chunk.copy(this.header, this.headerHeld, at, at + take);
          this.headerHeld += take;
          at += take;
          if (this.headerHeld < FRAME_HEADER_BYTES) return;
          this.headerHeld = 0;
          this.begin(this.header.readUInt8(0), this.header.readUInt32BE(1), this.header.readUInt32BE(5), sink);
        }
        continue;
      }
      const take = Math.min(this.remaining, end - at);
      if (this.type === FrameType.DATA) {
        const piece = take === end - at && at === 0 ? chunk : chunk.subarray(at, at + take);
        this.remaining -= take;
        at += take;
        if (this.remaining === 0) this.type = -1;
        sink.data(this.id, piece);
        continue;
      }
      chunk.copy(this.small!, this.smallHeld, at, at + take);
      this.smallHeld += take;
      this.remaining -= take;
      at += take;
      if (this.remaining === 0) this.finishSmall(sink);
    }
  }

  /** A header has been read: a frame without payload is delivered now, one with a payload is being read. */
  private begin(type: number, id: number, length: number, sink: FrameSink): void {
    checkHeader(type, id, length);
    this.id = id;
    if (type === FrameType.DATA) {
      sink.dataHeader(id, length);
      if (length > 0) {
        this.type = type;
        this.remaining = length;
      }
      return;
    }
    if (type === FrameType.OPEN) return sink.open(id);
    if (type === FrameType.FIN) return sink.fin(id);
    this.type = type;
    this.remaining = length;
    this.small = Buffer.alloc(length);
    this.smallHeld = 0;
    if (length === 0) this.finishSmall(sink); // an RST without a reason
  }

  private finishSmall(sink: FrameSink): void {
    const payload = this.small!;
    const type = this.type;
    this.type = -1;
    this.small = undefined;
    this.smallHeld = 0;
    if (type === FrameType.WINDOW) {
      const credit = payload.readUInt32BE(0);
      if (credit === 0) throw protocolError('a WINDOW of 0');
      return sink.window(this.id, credit);
    }
    sink.rst(this.id, payload.toString('utf8'));
  }
}

/** A frame's 9-byte header (from Node's small-buffer pool: no allocation of its own). */
export function frameHeader(type: FrameTypeCode, id: number, length: number): Buffer {
  const b = Buffer.allocUnsafe(FRAME_HEADER_BYTES);
  b.writeUInt8(type, 0);
  b.writeUInt32BE(id, 1);
  b.writeUInt32BE(length, 5);
  return b;
}

/** A whole WINDOW frame. */
export function windowFrame(id: number, credit: number): Buffer {
  const b = Buffer.allocUnsafe(FRAME_HEADER_BYTES + 4);
  b.writeUInt8(FrameType.WINDOW, 0);
  b.writeUInt32BE(id, 1);
  b.writeUInt32BE(4, 5);
  b.writeUInt32BE(credit, 9);
  return b;
}

/** A whole RST frame; the reason is cut to MAX_RST_REASON_BYTES (on a character boundary). */
export function rstFrame(id: number, reason: string): Buffer {
  let text = Buffer.from(reason, 'utf8');
  if (text.length > MAX_RST_REASON_BYTES) text = Buffer.from(text.subarray(0, MAX_RST_REASON_BYTES).toString('utf8').replace(/\uFFFD$/, ''), 'utf8').subarray(0, MAX_RST_REASON_BYTES);
  return Buffer.concat([frameHeader(FrameType.RST, id, text.length), text]);
}
