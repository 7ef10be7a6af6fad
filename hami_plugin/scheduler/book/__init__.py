"""The scheduler's book: its bookkeeping as one pure value (`book.Book`) and its parts."""
