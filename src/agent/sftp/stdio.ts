/**
 * SFTP on a plain pair of streams (the built-in sftp-server's standard input and output), with ssh2's SFTP
 * implementation in server mode doing the protocol: packet framing with a 256 KiB length limit, the INIT /
 * VERSION exchange, decoding every request, encoding every reply.
 *
 * Why this reaches into ssh2: ssh2 has a complete SFTP v3 server-side parser and encoder, but no public API to
 * run it on anything but the `sftp` subsystem of one of its own SSH sessions. The package that once offered it
 * on a plain stream (ssh2-streams' SFTPStream) is ssh2's deprecated predecessor, and writing a second parser
 * for the same protocol would be the worse choice. Apart from src/net/ssh.ts (a Connection's stream), this
 * is the only file that touches ssh2 internals, and it touches exactly these (ssh2 1.17.0, pinned in
 * package.json, lib/protocol/SFTP.js):
 *   - `new SFTP(client, chanInfo, { server: true })`, the class ssh2 hands to a session's `sftp` event.
 *     The constructor reads `client._protocol._remoteIdentRaw` (the peer's SSH version string: we pass
 *     OpenSSH's, see below) and keeps `chanInfo.outgoing`, the channel state its writes check (`state` 'open',
 *     `window` and `packetSize`, here unlimited: the output stream does flow control, `id`).
 *   - input: `sftp.push(chunk)` for every chunk of the input and `sftp.push(null)` at its end, as ssh2's own
 *     channel feeds it (a throw from it is taken as a malformed packet, see onData).
 *   - output: `client._protocol.channelData(id, bytes)` for every reply, and `client._protocol.channelClose(id)`
 *     when the parser gives up on a malformed packet (after emitting 'error').
 * Requests then come as ssh2's documented server-mode events ('OPEN', 'READ', ...) and are answered with its
 * documented methods (status, handle, data, name, attrs).
 *
 * The peer is taken to be OpenSSH: it decides the argument order of SYMLINK, which OpenSSH's sftp-server
 * reverses against the draft and every client that talks to OpenSSH follows; that is the server this one
 * replaces.
 */
import { createRequire } from 'node:module';
import type { Readable, Writable } from 'node:stream';
import type { SFTPWrapper } from 'ssh2';

interface ChannelState {
  id: number;
  state: 'open' | 'closing' | 'closed';
  window: number;
  packetSize: number;
}

type SftpConstructor = new (
  client: { _protocol: { _remoteIdentRaw: string; channelData(id: number, data: Buffer): void; channelClose(id: number): void } },
  chanInfo: { type: string; incoming: ChannelState; outgoing: ChannelState },
  cfg: { server: true },
) => SFTPWrapper & { push(data: Buffer | null): void };

const { SFTP } = createRequire(import.meta.url)('ssh2/lib/protocol/SFTP.js') as { SFTP: SftpConstructor };

export interface StdioSftp {
  /** ssh2's SFTP object in server mode: listen to its request events, answer with its reply methods. */
  readonly sftp: SFTPWrapper;
  /** Stop reading the input (for a reason) until every reason is released: flow control for the caller. */
  hold(reason: string): void;
  release(reason: string): void;
  /**
   * Resolves when the input has ended (the client is done; replies can still be sent), or with the error that
   * stopped the protocol (nothing more is sent).
   */
  readonly done: Promise<Error | undefined>;
  /** Stops reading; replies sent after this are dropped. */
  close(): void;
}

export function sftpOnStreams(input: Readable, output: Writable): StdioSftp {
  const outgoing: ChannelState = { id: 0, state: 'open', window: Infinity, packetSize: Infinity };
  const holds = new Set<string>();
  let finish!: (err: Error | undefined) => void;
  const done = new Promise<Error | undefined>((resolve) => (finish = resolve));
  let failure: Error | undefined;

  const hold = (reason: string) => {
    holds.add(reason);
    input.pause();
  };
  const release = (reason: string) => {
    holds.delete(reason);
    if (holds.size === 0 && outgoing.state === 'open') input.resume();
  };
  const close = () => {
    if (outgoing.state === 'closed') return;
    outgoing.state = 'closed';
    input.off('data', onData);
    input.destroy();
    finish(failure);
  };
  const protocol = {
    _remoteIdentRaw: 'SSH-2.0-OpenSSH',
    channelData: (_id: number, data: Buffer) => {
      if (!output.write(data) && !holds.has('output')) {
        hold('output');
        output.once('drain', () => release('output'));
      }
    },
    channelClose: () => close(),
  };
  const sftp = new SFTP({ _protocol: protocol }, { type: 'sftp', incoming: { ...outgoing }, outgoing }, { server: true });
  const onData = (chunk: Buffer) => {
    if (outgoing.state !== 'open') return;
    try {
      sftp.push(chunk);
    } catch (err) {
      // ssh2's parser throws on some malformed packets instead of reporting them (a length field of 2^31 or
      // more turns negative in its shifts and passes its limit; a handle cut short before attributes that still
      // parse): a protocol failure like any other, not a crash.
      failure ??= new Error(`malformed packet (${err instanceof Error ? err.message : String(err)})`);
      close();
    }
  };
  // ssh2 emits 'error' and then closes the channel (channelClose above) on a packet it cannot parse.
  sftp.on('error', (err: Error) => (failure ??= err));
  input.on('data', onData);
  input.once('end', () => {
    if (outgoing.state !== 'open') return;
    sftp.push(null);
    finish(undefined);
  });
  input.once('error', (err) => {
    failure ??= err;
    close();
  });
  output.on('error', (err) => {
    failure ??= err;
    close();
  });
  return { sftp, hold, release, done, close };
}
