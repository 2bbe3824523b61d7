/**
 * The one shutdown order of a gateway process. Each role starter registers what it opened under its phase as
 * soon as it is open; stop() runs the phases in STOP_ORDER:
 *
 *   agents    the agents' tunnels, schedule exports and SSH Service: they stop using the Proxy first
 *   proxy     the Proxy's tunnel server (agents are told to reconnect) and listeners
 *   auth      the Auth API's listener
 *   backend   what every role shared: the connection counters, then the Backend, which the phases before may
 *             still write to (a proxy clears the presence of its agents as it closes)
 *
 * Closers of one phase run together; a phase starts when the one before has ended. A closer that fails does not
 * keep the later phases from running: stop() rejects with the first failure once every phase has run.
 */
export const STOP_ORDER = ['agents', 'proxy', 'auth', 'backend'] as const;
export type StopPhase = (typeof STOP_ORDER)[number];

export type Closer = () => void | Promise<void>;

export class Lifecycle {
  private readonly closers = new Map<StopPhase, Closer[]>(STOP_ORDER.map((phase) => [phase, []]));
  private stopping: Promise<void> | undefined;

  /** Registers what stop() closes in phase (in the order registered, but concurrently). */
  onStop(phase: StopPhase, closer: Closer): void {
    if (this.stopping) throw new Error(`lifecycle: a ${phase} closer was registered after stop()`);
    this.closers.get(phase)!.push(closer);
  }

  /** Closes everything registered, phase after phase. Calling it again returns the same promise. */
  stop(): Promise<void> {
    this.stopping ??= this.run();
    return this.stopping;
  }

  private async run(): Promise<void> {
    const failures: unknown[] = [];
    for (const phase of STOP_ORDER) {
      const results = await Promise.allSettled(this.closers.get(phase)!.map(async (close) => close()));
      for (const r of results) if (r.status === 'rejected') failures.push(r.reason);
    }
    if (failures.length > 0) throw failures[0];
  }
}
