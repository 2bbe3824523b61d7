/** The part of spdy-transport 3.0.0 (no published types) the stand-in API server uses, as a SPDY/3.1 server. */
declare module 'spdy-transport' {
  import type { Duplex } from 'node:stream';
  export interface SpdyStream extends Duplex {
    id: number;
    headers: Record<string, string>;
    respond(status: number, headers: Record<string, string>, cb?: () => void): void;
    abort(code?: string, cb?: () => void): void;
  }
  export interface SpdyConnection {
    on(event: 'stream', cb: (s: SpdyStream) => void): this;
    on(event: 'error' | 'close', cb: (err?: Error) => void): this;
    end(cb?: () => void): void;
    /** Client side (tests): opens a stream (SYN_STREAM with these headers). */
    request(uri: { method: string; path: string; host?: string; headers: Record<string, string> }, cb?: (err: Error | null, s: SpdyStream) => void): SpdyStream;
    start(version: number): void;
    destroyStreams(err?: Error): void;
    _spdyState: {
      window: { send: { current: number; max: number; limit: number } };
      streamWindow: { send: { current: number; max: number; limit: number } };
      parser: { parseKVs(body: unknown, cb: (err: Error | null, headers: Record<string, string>) => void): void };
    };
  }
  const transport: {
    connection: { create(socket: Duplex, options: { protocol: 'spdy'; isServer: boolean; maxStreams?: number; windowSize?: number }): SpdyConnection };
  };
  export default transport;
}
