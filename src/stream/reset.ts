/**
 * Resetting a stream: telling its far side that the bytes stopped because something broke, never that they ended.
 * A relay that only destroys a side gives it a clean end on most transports (a TCP FIN; on TLS a FIN that Node
 * reports as 'end'; an SSH channel CLOSE, which ssh2 turns into an end; an HTTP/2 RST_STREAM with NO_ERROR, which
 * Node turns into an end), and a cut download then looks complete. resetStream picks, per transport, the signal
 * its far side reads as an abort:
 *
 *   TCP socket      resetAndDestroy(): an RST (the peer reads ECONNRESET)
 *   TLS socket      the stream it runs on is reset (TLS has no abort of its own that Node reports: a missing
 *                   close_notify is not seen), then the TLS socket is destroyed
 *   HTTP/2 stream   RST_STREAM with INTERNAL_ERROR (the peer's stream errors; Node ends one reset with CANCEL)
 *   a stream that says how (RESET_STREAM: a v1 tunnel's SSH channel, src/net/ssh.ts) that way
 *   anything else   destroy(): a tunnel v2 stream sends its RST frame (src/tunnel/session.ts)
 *
 * splice (src/stream/splice.ts) decides when: a side's clean end ends the other, a side's error or abort resets it.
 */
import net from 'node:net';
import tls from 'node:tls';
import type { Duplex } from 'node:stream';
import { tlsSocketParent } from '../internals.js';

/** A stream whose transport has its own abort puts it under this key (a function, called with the stream as this). */
export const RESET_STREAM = Symbol('resetStream');

interface Resettable {
  [RESET_STREAM]?: (this: Duplex) => void;
}

/** Node's HTTP/2 stream class is not exported: it is known by its RST code and close(code). */
function isHttp2Stream(stream: Duplex): boolean {
  return 'rstCode' in stream && typeof (stream as { close?: unknown }).close === 'function';
}

function ignore(): void {}

/**
 * Whether a stream whose readable half ended ended cleanly: an HTTP/2 stream that the peer reset with CANCEL has
 * ended too in Node, after 'aborted' (and an HTTP response cut short is 'aborted' as well).
 */
export function endedCleanly(stream: Duplex): boolean {
  return stream.readableEnded && (stream as { aborted?: unknown }).aborted !== true;
}

/** Resets `stream` (once; a destroyed stream is left as it is). */
export function resetStream(stream: Duplex): void {
  if (stream.destroyed) return;
  const own = (stream as Resettable)[RESET_STREAM];
  if (typeof own === 'function') return own.call(stream);
  if (stream instanceof tls.TLSSocket) {
    // The TLS socket wraps the stream it was handed (src/net/tls.ts, src/stream/tls.ts): that one carries the RST.
    // Not found (src/internals.ts): the TLS socket is only destroyed, and its far side sees an end.
    const parent = tlsSocketParent(stream);
    if (parent && parent !== stream) resetStream(parent);
    stream.destroy();
    return;
  }
  if (stream instanceof net.Socket) return resetSocket(stream);
  if (isHttp2Stream(stream)) {
    // destroy(err) sends RST_STREAM INTERNAL_ERROR. Not close(CANCEL): Node's receiving end reports a CANCEL as
    // 'aborted' and then an end, which a relay of an earlier version would pass on as one; and close() first ends
    // the writable side, so the END_STREAM of data already queued could go out before the RST_STREAM. The local
    // 'error' of destroy(err) has nobody to tell.
    stream.on('error', ignore);
    stream.destroy(new Error('the other side of the relay broke'));
    return;
  }
  stream.destroy();
}

/** A TCP socket sends an RST; a socket on another handle (a pipe, a socket still connecting elsewhere) is destroyed. */
function resetSocket(socket: net.Socket): void {
  try {
    socket.resetAndDestroy();
  } catch {
    // Not a TCP handle (resetAndDestroy throws ERR_INVALID_HANDLE_TYPE): a plain destroy is all there is.
    socket.destroy();
  }
}
