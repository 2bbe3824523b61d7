import net from 'node:net';
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import { endedCleanly, resetStream } from './reset.js';

/**
 * Joins two streams both ways with back-pressure (pipe) and half-close, and decides for every relay how one side's
 * end reaches the other (docs/security.md, "A broken stream is reset, never ended"):
 *
 *   a clean end    a side's readable half ends (FIN, a tunnel stream's FIN, an SSH EOF, END_STREAM, a framed
 *                  stream's end frame): the other side's writable half is ended after it has written everything
 *                  it holds. Only this is an end (a TCP socket's end is checked to be a FIN: passOnEnd).
 *   a break        a side errors, or closes without its readable half having ended (an RST, a tunnel lost or its
 *                  stream reset, an SSH channel closed without EOF, RST_STREAM, a destroy): the other side is
 *                  RESET at once (src/stream/reset.ts), never ended, so that a cut download is an error at the
 *                  client and not a short file.
 *   nowhere to go  a side that ended cleanly and then closed while the other still sends: the other first writes
 *                  out what it holds (its end was passed on), then is destroyed (a resource that closed while the
 *                  client still sends: the client sees its connection go, as with TCP, instead of a stall until a
 *                  linger timer).
 */
export function splice(a: Duplex, b: Duplex, onClose?: () => void): void {
  let closed = 0;
  const closedOne = () => {
    if (++closed === 2) onClose?.();
  };
  a.pipe(b, { end: false });
  b.pipe(a, { end: false });
  a.once('end', () => passOnEnd(a, b));
  b.once('end', () => passOnEnd(b, a));
  a.once('error', () => resetStream(b));
  b.once('error', () => resetStream(a));
  // After its first error a stream may report more (a write that was under way): they change nothing here.
  a.on('error', ignore);
  b.on('error', ignore);
  a.once('close', () => {
    passOnClose(a, b);
    closedOne();
  });
  b.once('close', () => {
    passOnClose(b, a);
    closedOne();
  });
}

function ignore(): void {}

const EMPTY = Buffer.alloc(0);

/**
 * `from`'s readable half ended: `to`'s writable is ended after what it holds. A plain TCP socket's end is checked
 * first: libuv reports an RST that arrives right behind data as an end (a short read, then the hang-up, and no
 * read that would have seen ECONNRESET), so a zero-length write asks the kernel: after an RST it fails (the
 * socket's pending error), after a FIN it succeeds and sends nothing. (A socket whose own writable half already
 * ended cannot be asked this way; its end is taken as it comes.)
 */
function passOnEnd(from: Duplex, to: Duplex): void {
  if ((from as { aborted?: unknown }).aborted === true) return resetStream(to); // an HTTP/2 stream reset with CANCEL
  if (!(from instanceof net.Socket) || from instanceof tls.TLSSocket || from.writableEnded || from.destroyed) return void endOf(to);
  from.write(EMPTY, (err) => {
    if (!err) return endOf(to);
    resetStream(to);
    from.destroy();
  });
}

function endOf(to: Duplex): void {
  if (to.writable) to.end();
}

/** `from` closed: the rules above, for `to`. */
function passOnClose(from: Duplex, to: Duplex): void {
  if (!endedCleanly(from)) return resetStream(to);
  if (to.readableEnded || to.destroyed) return;
  if (to.writableFinished) to.destroy();
  else to.once('finish', () => to.destroy());
}
