/**
 * A WebSocket as a byte stream, for the connection upgrade (the Proxy's end in src/proxy/frontdoor.ts, the
 * client's in src/dial/upgrade.ts): TLS runs over it as over a socket. ws's createWebSocketStream does the
 * WebSocket side (back-pressure both ways: it pauses the socket when the reader lags, and a write completes when
 * ws has sent it), but it sends each write as one message, and a TLS socket may hand its stream several MiB of
 * records in one write: the other end, which caps a message at UPGRADE_MAX_PAYLOAD, would close with 1009. So
 * the writes pass through a splitter first (slices of at most `maxMessage` bytes, still one message each). A
 * WebSocket that closes abnormally destroys the stream with an error: a break, not an end.
 */
import { Duplex, Transform } from 'node:stream';
import { createWebSocketStream, type WebSocket } from 'ws';

/** A Duplex over ws whose writes go out as messages of at most maxMessage bytes. */
export function webSocketDuplex(ws: WebSocket, maxMessage: number): Duplex {
  const inner = createWebSocketStream(ws);
  const splitter = new Transform({
    transform(chunk: Buffer, _encoding, callback) {
      for (let at = 0; at < chunk.length; at += maxMessage) this.push(chunk.subarray(at, at + maxMessage));
      callback();
    },
  });
  splitter.pipe(inner);
  const stream = Duplex.from({ readable: inner, writable: splitter });
  inner.on('error', (err) => stream.destroy(err));
  // A close that is not a normal one (1009 too large, 1006 the connection dropped, 1002 a protocol error) is a
  // break: whatever runs on the stream (TLS) fails at once instead of waiting for its own deadline.
  ws.once('close', (code: number) => {
    if (code !== 1000 && code !== 1005) stream.destroy(Object.assign(new Error(`the WebSocket closed with code ${code}`), { code: 'ERR_WEBSOCKET_CLOSED' }));
  });
  stream.on('close', () => inner.destroy());
  return stream;
}
