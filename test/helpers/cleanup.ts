/** Runs every clean-up step in order, even when some fail (each failure is reported, none stops the rest). */
export async function runCleanup(steps: Array<() => unknown>): Promise<void> {
  for (const step of steps) {
    try {
      await step();
    } catch (err) {
      console.error('clean-up step failed:', err);
    }
  }
}
