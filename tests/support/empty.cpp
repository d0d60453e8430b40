// Keeps msa_support linkable before it has sources of its own.
