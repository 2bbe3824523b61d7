import type { Duplex } from 'node:stream';

/**
 * Joins two streams both ways with back-pressure (pipe) and half-close: when one side's readable half ends, the
 * other side's writable half is ended after it has written everything it holds. A side that closes without
 * having ended cleanly (reset, error, destroy) takes the other down with it; a side that ended cleanly leaves
 * the other to finish its own direction, as long as it stays open to take it: once it has closed, the other's
 * unfinished direction has nowhere to go and the other is destroyed too (a resource that closed while the client
 * still sends: the client sees its connection go, as with TCP, instead of a stall until a linger timer).
 */
export function splice(a: Duplex, b: Duplex, onClose?: () => void): void {
  let closed = 0;
  const closedOne = () => {
    if (++closed === 2) onClose?.();
  };
  const fail = () => {
    a.destroy();
    b.destroy();
  };
  a.pipe(b);
  b.pipe(a);
  a.once('error', fail);
  b.once('error', fail);
  a.once('close', () => {
    if (!a.readableEnded || !b.readableEnded) b.destroy();
    closedOne();
  });
  b.once('close', () => {
    if (!b.readableEnded || !a.readableEnded) a.destroy();
    closedOne();
  });
}
