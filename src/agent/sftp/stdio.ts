/**
 * SFTP on a plain pair of streams (the built-in sftp-server's standard input and output), with ssh2's SFTP
 * implementation in server mode doing the protocol: packet framing with a 256 KiB length limit, the INIT /
 * VERSION exchange, decoding every request, encoding every reply.
 *
 * Why this reaches into ssh2: ssh2 has a complete SFTP v3 server-side parser and encoder, but no public API to
 * run it on anything but the `sftp` subsystem of one of its own SSH sessions. src/internals.ts (sftpServer) makes
 * ssh2's SFTP class run on two callbacks instead of a channel, and says exactly which internals that takes and
 * what happens when they are gone (GW_ERR_SFTP_UNAVAILABLE). Here: its input is fed with `sftp.push(chunk)` for
 * every chunk and `sftp.push(null)` at the end, as ssh2's own channel feeds it (a throw from it is taken as a
 * malformed packet, see onData); its replies go to the output, and it gives up on a malformed packet by closing
 * (after emitting 'error'). Its outgoing channel state is ours: window and packet size unlimited (the output
 * stream does flow control), `state` set to 'closed' by close(). Requests then come as ssh2's documented server-mode events ('OPEN', 'READ', ...) and are answered with its
 * documented methods (status, handle, data, name, attrs).
 *
 * The peer is taken to be OpenSSH (the version string sftpServer gives ssh2): it decides the argument order of SYMLINK, which OpenSSH's sftp-server
 * reverses against the draft and every client that talks to OpenSSH follows; that is the server this one
 * replaces.
 */
import type { Readable, Writable } from 'node:stream';
import type { SFTPWrapper } from 'ssh2';
import { sftpServer, type SftpChannelState } from '../../internals.js';

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
  const outgoing: SftpChannelState = { id: 0, state: 'open', window: Infinity, packetSize: Infinity };
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
  const sftp = sftpServer(
    {
      data: (data) => {
        if (!output.write(data) && !holds.has('output')) {
          hold('output');
          output.once('drain', () => release('output'));
        }
      },
      close: () => close(),
    },
    outgoing,
  );
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
