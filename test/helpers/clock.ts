/**
 * A clock tests drive by hand, for code that takes BackoffDeps (src/backoff.ts): timers fire only when advance()
 * passes their time, in order, so a test walks a retry sequence without waiting and without asserting a timing.
 */
import type { BackoffDeps } from '../../src/backoff.js';

interface Timer {
  id: number;
  at: number;
  fn: () => void;
}

export class ManualClock {
  private t = 0;
  private seq = 0;
  private timers: Timer[] = [];
  /** The delay of every timer set, in order (what a test compares with the policy). */
  readonly delays: number[] = [];

  constructor(start = 0) {
    this.t = start;
  }

  now(): number {
    return this.t;
  }

  /** Timers not yet fired nor cleared. */
  get pending(): number {
    return this.timers.length;
  }

  /** The deps a Backoff takes: this clock's time and timers, and `random` when given. */
  deps(random?: () => number): BackoffDeps {
    return {
      now: () => this.t,
      setTimer: (fn, ms) => {
        const id = ++this.seq;
        this.delays.push(ms);
        this.timers.push({ id, at: this.t + ms, fn });
        return id;
      },
      clearTimer: (id) => {
        this.timers = this.timers.filter((x) => x.id !== id);
      },
      ...(random ? { random } : {}),
    };
  }

  /** Moves time on by ms, firing every timer due on the way (those set meanwhile included). */
  advance(ms: number): void {
    const end = this.t + ms;
    for (;;) {
      const due = this.timers.filter((x) => x.at <= end).sort((a, b) => a.at - b.at || a.id - b.id)[0];
      if (!due) break;
      this.timers = this.timers.filter((x) => x !== due);
      this.t = Math.max(this.t, due.at);
      due.fn();
    }
    this.t = end;
  }

  /** Fires the next timer whatever its time (moving the clock to it); false when none is pending. */
  fireNext(): boolean {
    const due = [...this.timers].sort((a, b) => a.at - b.at || a.id - b.id)[0];
    if (!due) return false;
    this.advance(due.at - this.t);
    return true;
  }
}
