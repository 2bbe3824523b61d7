import type { Duplex } from 'node:stream';

/**
 * Joins two streams both ways with back-pressure (pipe) and half-close: when one side's readable half ends, the
 * other side's writable half is ended after it has written everything it holds. A side that closes without
 * having ended cleanly (reset, error, destroy) takes the other down with it; a side that ended cleanly leaves
 * the other to finish its own direction.
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
    if (!a.readableEnded) b.destroy();
    closedOne();
  });
  b.once('close', () => {
    if (!b.readableEnded) a.destroy();
    closedOne();
  });
}
