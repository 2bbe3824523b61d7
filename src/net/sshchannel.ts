/**
 * A v1 tunnel's SSH channel as a relayed stream (src/stream/splice.ts): SSH tells an end of data (CHANNEL_EOF)
 * from a channel going away (CHANNEL_CLOSE), but ssh2 turns both into an end of the channel's readable side, and a
 * dead connection too (its channels are closed for it). A relay would then pass a cut as a clean end. relayChannel
 * makes the channel say what happened:
 *
 *   EOF, then CLOSE     a clean end, as before
 *   CLOSE without EOF   the channel is destroyed without ending: its relay resets the other side
 *   the connection lost the same (ssh2 closes every channel of a dead connection without EOF)
 *
 * and gives it a reset of its own (RESET_STREAM, src/stream/reset.ts): CLOSE without EOF, which the far side's
 * relayChannel reads as a break. ssh2's destroy() would first end the channel, and a flushed EOF is a clean end.
 *
 * This reads ssh2's channel state (closed before it pushes the end?) through src/internals.ts, which says why and
 * what happens without it; nothing else of ssh2 is needed, so it is not imported (the agent loads ssh2 only for a
 * v1 tunnel).
 */
import { Duplex } from 'node:stream';
import { sshChannelClosed } from '../internals.js';
import { RESET_STREAM } from '../stream/reset.js';

interface SshChannelState {
  close(): void;
}

const relayed = new WeakSet<object>();

/** Makes `channel` (an ssh2 channel) tell a break from an end, and reset as SSH can; returns it. */
export function relayChannel<T extends object>(channel: T): T {
  if (relayed.has(channel)) return channel;
  relayed.add(channel);
  const ch = channel as unknown as Duplex & SshChannelState;
  const push = ch.push;
  let ended = false;
  ch.push = function (this: Duplex, chunk: unknown, encoding?: BufferEncoding): boolean {
    if (chunk === null && !ended) {
      if (sshChannelClosed(ch) === true) {
        // CLOSE with no EOF before it: a break, not an end.
        Duplex.prototype.destroy.call(ch);
        return false;
      }
      ended = true;
    }
    return push.call(this, chunk, encoding);
  };
  (ch as unknown as Record<symbol, unknown>)[RESET_STREAM] = function (this: Duplex & SshChannelState) {
    this.close();
    Duplex.prototype.destroy.call(this);
  };
  return channel;
}
