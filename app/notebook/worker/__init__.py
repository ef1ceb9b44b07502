"""What the job worker runs: the queue, processing, podcast episodes, command states
and worker presence. No Flask, no route module (an import contract checks it)."""
