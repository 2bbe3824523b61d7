/**
 * The byte pump of a pass-through route: a routed stream and its upstream joined both ways, with what two pipe()
 * calls give (back-pressure, half-close) and without what they cost per connection: pipe() registers about eight
 * listeners per direction (with a closure each, and a wrapper for each once()) and emits pipe/unpipe events; this
 * registers five (data, end, error and close on the side read, drain on the side written).
 *
 *   back-pressure  a write that returns false pauses the side that was read, until the writer emits 'drain'
 *   half-close     a side's readable end ends the other's writable, once it has written what it holds
 *   close          a side that closes without having ended cleanly (reset, error, destroy) RESETS the other
 *                  (src/stream/reset.ts: an RST, never a FIN that would pass a cut as an end);
 *                  a side that ended cleanly leaves the other to finish writing what it holds, then closes it
 *                  (nothing it could still read has anywhere to go: with allowHalfOpen off, a side closes as
 *                  soon as its peer's FIN arrives, and its upstream would otherwise wait for a FIN of its own)
 *   errors         destroy the side that failed (never thrown at the process); its 'close' resets the other
 *
 * src/stream/splice.ts joins the tunnel's streams by the same rules with pipe(). The Proxy's own routes all end TLS and use neither here: this serves a
 * Multiplexer route that passes bytes through (bench:mux's router).
 */
import type { Duplex } from 'node:stream';
import { resetStream } from '../stream/reset.js';

/** Joins a and b both ways; onClose runs once both have closed. */
export function passThrough(a: Duplex, b: Duplex, onClose?: () => void): void {
  let open = 2;
  const closed = onClose ? () => void (--open === 0 && onClose()) : undefined;
  forward(a, b, closed);
  forward(b, a, closed);
}

/** One direction: from's bytes to `to`; from's end, close and errors as the rules above say. */
function forward(from: Duplex, to: Duplex, closed: (() => void) | undefined): void {
  // A side that can no longer be written (ended, destroyed) gets nothing more: pipe() unpipes it at 'finish', and a
  // write or end() on it would only build an error (with its stack) for nobody.
  from.on('data', (chunk: Buffer) => {
    if (to.writable && !to.write(chunk)) from.pause();
  });
  to.on('drain', () => from.resume());
  from.on('end', () => {
    if (to.writable) to.end();
  });
  from.on('error', destroySelf);
  from.on('close', () => {
    if (!from.readableEnded || from.errored) resetStream(to);
    else if (to.writableFinished) to.destroy();
    else to.once('finish', destroySelf);
    closed?.();
  });
}

/** For 'error' (and 'finish' of a side whose peer is gone): the stream is done. */
function destroySelf(this: Duplex): void {
  this.destroy();
}
